"""The HTTP session API of ``cantrip serve``, written once over a session backend.

A small ASGI application (no framework) served by hypercorn's trio worker, so the
server runs in the same trio world as what it serves. Every route asks a
:class:`~cantrip.protocols.sessions.SessionBackend` -- the in-process one (entities run
here) or the PostgreSQL one (``serve --db``: a stateless replica, casts run by
``cantrip worker`` processes) -- so one ``/openapi.json`` is one behaviour, whatever the
mode. What a mode lacks its backend's ``capabilities`` say; nothing here asks which
backend it is.

Routes (JSON in and out; errors are ``{"error": {"code", "message"}}``, their statuses
one table, :mod:`._errors`):

* ``GET  /health`` -- liveness, and what the cantrip is;
* ``GET  /openapi.json`` -- this API as an OpenAPI 3.1 document;
* ``POST /sessions`` (``Idempotency-Key``; ``user``, ``cwd``) -- a new session (201);
  ``GET /sessions``;
* ``GET  /sessions/{id}`` -- one session; ``DELETE`` removes its tree from the loom
  (the backend's ``delete``: the retention rule, refused while a prompt runs);
* ``POST /sessions/{id}/prompt`` -- ``{"prompt": ...}``: one cast, answered with its
  result, or with ``Accept: text/event-stream``/``?stream=1`` a stream of its events
  ending with a ``result`` event (:mod:`._streams`); ``Idempotency-Key`` (a repeat
  joins or replays), ``?on_busy=`` (double-texting), ``?cancel_on_disconnect=1``;
* ``POST /sessions/{id}/messages`` -- steer the running prompt (202);
* ``POST /sessions/{id}/cancel`` -- the running prompt, or the one named
  (``prompt_id``, ``idempotency_key``), or with ``{"next": true}`` the next one;
* ``GET  /sessions/{id}/pending``, ``POST /sessions/{id}/pending/{pause_id}`` -- the
  calls the session waits on a human for, and an answer (its continuation's result);
* ``GET  /sessions/{id}/thread`` -- its turns, root first;
* ``GET  /sessions/{id}/events`` -- its events from now (or from the position a
  ``Last-Event-ID``/``?after=`` names), heartbeat comments while quiet.

Beside them, :data:`Mount` s: what else the server answers (the browser viewer, A2A),
asked in order before the routes, and ``POST /agui`` (an :data:`AguiRun`) -- each given
the backend by whoever builds the app (:mod:`._serve`).

Under load and at shutdown (:mod:`cantrip.protocols.middleware._lifecycle`): every
prompt is admitted or refused in one place (:class:`Admission`: ``overloaded``,
``shutting_down``, 503 + ``Retry-After``), before the backend sees it; the drain
answers every open request before hypercorn stops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qs

import trio

from cantrip._approval import PauseError
from cantrip._cantrip import Cantrip
from cantrip._redact import get_logger
from cantrip.protocols.asgi._api_models import (
    ON_BUSY,
    AnswerRequest,
    CancelRequest,
    CreateSession,
    SteerRequest,
)
from cantrip.protocols.asgi._openapi import openapi_document
from cantrip.protocols.asgi._requests import (
    allow,
    idempotency_key,
    prompt_intent,
    read_body,
    refuse_nul,
    truthy,
    validated,
    wants_stream,
)
from cantrip.protocols.asgi._responses import (
    HttpError,
    Receive,
    Scope,
    Send,
    end_body,
    error_response,
    json_response,
    not_found,
    sse_error,
)
from cantrip.protocols.http import _streams
from cantrip.protocols.http._errors import http_error, unavailable
from cantrip.protocols.middleware._lifecycle import Admission, Drain, ServeOptions
from cantrip.protocols.sessions import (
    BusyPolicy,
    EventId,
    SessionBackend,
    SessionError,
    SessionInfo,
    steered,
    turn_dict,
)

log = get_logger("cantrip.http")

Mount = Callable[[Scope, Receive, Send], Awaitable[bool]]
"""What else the server answers: ``mount(scope, receive, send)`` answers the request
and returns True, or returns False untouched (the next mount, then the routes, get
it). The browser viewer's and A2A's ``dispatch`` are mounts."""

AguiRun = Callable[[Scope, Receive, Send], Awaitable[None]]
"""``POST /agui``: an AG-UI run, its body unread (the method is checked here); the
scope for a reconnect's ``Last-Event-ID`` and ``?reconnect_s=``."""

REFUSALS = (HttpError, SessionError, PauseError)


class HttpApp:
    """The ASGI application of ``cantrip serve``: the routes over one backend."""

    def __init__(
        self,
        backend: SessionBackend,
        cantrip: Cantrip,
        options: ServeOptions | None = None,
        *,
        mounts: Sequence[Mount] = (),
        agui: AguiRun | None = None,
        title: str = "cantrip serve",
    ) -> None:
        self.backend = backend
        self.cantrip = cantrip
        """The spell served: what ``/health`` describes."""
        self.options = options or ServeOptions()
        self.drain = Drain()
        self.admission = Admission(self.drain, self.options)
        self.mounts = list(mounts)
        self.agui = agui
        self.title = title

    # -- ASGI ----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        with self.drain.request():
            try:
                if self.drain.closing:
                    raise SessionError("shutting_down", "the server is shutting down")
                await self._route(scope, receive, sending)
            except* REFUSALS as group:
                # also one raised inside a stream's nursery (trio groups those)
                exc = self.refusal(_first(group))
                if not started:
                    await error_response(send, exc)
                else:  # an event stream already answered 200: its last event says why
                    await sse_error(send, exc)
                    await end_body(send)

    def refusal(self, exc: BaseException) -> HttpError:
        """The API's answer to what a request met (the one status table)."""
        if isinstance(exc, SessionError | PauseError):
            return http_error(exc, self.options.retry_after_s)
        assert isinstance(exc, HttpError)
        return exc

    async def shutdown(self) -> None:
        """Drain: stop taking work; the backend's casts get the grace period (in
        process they are then cut off and answered); prompts waited on elsewhere (a
        replica's, at its workers) get what is left of it, then ``503``; every event
        stream ends with a ``shutdown`` event; open requests get their answers."""
        options = self.options
        self.drain.begin(options.grace_s)
        deadline = trio.current_time() + options.grace_s
        await self.backend.shutdown(options.grace_s)
        now = trio.current_time()
        # a backend that ended its casts at the deadline: their requests answer now
        until = deadline if now < deadline else now + options.answer_timeout_s
        with trio.move_on_at(until):
            await self.admission.open.empty()
        await self.drain.end_streams(options.answer_timeout_s)

    # -- routes --------------------------------------------------------------------

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The routes ``/openapi.json`` documents: the path and method are checked here
        (404 before 405, an unknown session before a wrong method)."""
        for mount in self.mounts:
            if await mount(scope, receive, send):
                return
        log.debug("%s %s", scope["method"], scope["path"])
        refuse_nul(scope)
        method = scope["method"]
        parts = [p for p in scope["path"].split("/") if p]
        # a blank value is a value (``?stream=`` is a 400 like any bad one, not "no")
        query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)
        backend = self.backend
        if parts == ["health"]:
            allow(method, "GET")
            await json_response(send, 200, await self._health())
        elif parts == ["openapi.json"]:
            allow(method, "GET")
            await json_response(send, 200, openapi_document(self.title))
        elif parts == ["agui"]:  # AG-UI, beside the API it translates
            allow(method, "POST")
            if self.agui is None:
                raise HttpError(404, "not_found", "this server does not speak AG-UI")
            await self.agui(scope, receive, send)
        elif parts == ["sessions"]:
            allow(method, "GET", "POST")
            if method == "POST":
                asked = validated(CreateSession, await read_body(receive))
                info, created = await backend.create(
                    idempotency_key(scope), user=asked.user, cwd=asked.cwd
                )
                # A repeated key gets the response the key first got (201, the same
                # session), marked as a replay -- one status per outcome keeps the
                # documented contract independent of server state.
                replayed = {} if created else {"idempotent-replayed": "true"}
                await json_response(send, 201, info.to_dict(), replayed)
            else:
                listed = [i.to_dict() for i in await backend.sessions()]
                await json_response(send, 200, {"sessions": listed})
        elif len(parts) == 4 and parts[0] == "sessions" and parts[2] == "pending":
            allow(method, "POST")
            info = await backend.find(parts[1])
            answer = validated(AnswerRequest, await read_body(receive))
            await self._answer(info, parts[3], answer, receive, send)
        elif len(parts) >= 2 and parts[0] == "sessions" and len(parts) <= 3:
            info = await backend.find(parts[1])
            await self._session_route(info, parts[2] if len(parts) == 3 else None, scope,
                                      receive, send, query)  # fmt: skip
        else:
            raise not_found(scope)

    async def _session_route(
        self,
        info: SessionInfo,
        action: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        query: dict[str, list[str]],
    ) -> None:
        method = scope["method"]
        sid = info.session_id
        backend = self.backend
        if action is None:
            allow(method, "GET", "DELETE")
            if method == "DELETE":
                await backend.delete(sid)
                await json_response(send, 200, {"session_id": sid, "deleted": True})
            else:
                await json_response(send, 200, info.to_dict())
        elif action == "prompt":
            allow(method, "POST")
            key = idempotency_key(scope)
            on_busy = self._on_busy(query)
            after = _streams.resume_point(scope, query)
            if after is not None and not isinstance(after, EventId):
                raise HttpError(400, "bad_event_id", "a prompt stream resumes after an event id")
            intent = prompt_intent(await read_body(receive))
            stream = wants_stream(scope, query)  # (a bad value is refused before the cast)
            hang_up = truthy(query.get("cancel_on_disconnect"))
            with self.admission.admit():  # overloaded, shutting_down: before the backend
                # the session as read above: not read again (issue 46)
                submitted = await backend.submit(info, intent, key=key, on_busy=on_busy)
                if stream:
                    await _streams.prompt_stream(self, info, submitted, key, receive, send,
                                                 hang_up, after)  # fmt: skip
                    return
                outcome = await _streams.outcome(self, info, submitted.prompt_id, receive)
            if outcome is not None:  # None: the client hung up, nobody to answer
                result = {**_streams.result_of(info, outcome), "prompt_id": submitted.prompt_id}
                await json_response(send, 200, result, {"prompt-id": submitted.prompt_id})
        elif action == "messages":
            allow(method, "POST")
            text = validated(SteerRequest, await read_body(receive)).text.strip()
            if not text:  # what the schema's pattern lets through and str.strip() drops
                raise HttpError(400, "bad_request", "a steering message needs some text")
            await backend.steer(sid, text)
            await json_response(send, 202, steered())
        elif action == "pending":
            allow(method, "GET")
            pending = [p.to_dict() for p in await backend.pauses(info)]
            await json_response(send, 200, {**info.to_dict(), "pending": pending})
        elif action == "cancel":
            allow(method, "POST")
            target = validated(CancelRequest, await read_body(receive))
            cancelled = await backend.cancel(
                sid, prompt_id=target.prompt_id, key=target.idempotency_key, next_prompt=target.next
            )
            await json_response(send, 200, cancelled.to_dict())
        elif action == "thread":
            allow(method, "GET")
            turns = [turn_dict(t) for t in await backend.thread(info)]
            await json_response(send, 200, {**info.to_dict(), "turns": turns})
        elif action == "events":
            allow(method, "GET")
            await _streams.events(self, info, _streams.position(scope, query, info), receive, send)
        else:
            raise not_found(scope)

    async def _answer(
        self, info: SessionInfo, pause_id: str, answer: AnswerRequest, receive: Receive, send: Send
    ) -> None:
        """An answer to a pause: the continued cast's result, or 202 when a running
        prompt waited on it in place (that prompt answers)."""
        with self.admission.holding():  # (refused while shutting down, not overloaded)
            submitted = await self.backend.answer(
                info.session_id, pause_id, answer.decision_value()
            )
            if submitted is None:
                await json_response(send, 202, {"answered": True, "pause_id": pause_id})
                return
            outcome = await _streams.outcome(self, info, submitted.prompt_id, receive)
        if outcome is not None:
            await json_response(send, 200, _streams.result_of(info, outcome))

    def _on_busy(self, query: dict[str, list[str]]) -> BusyPolicy:
        """The prompt's double-texting policy: the request's, else the server's."""
        given = query.get("on_busy")
        if not given:
            return self.options.on_busy  # type: ignore[return-value]
        if given[-1] not in ON_BUSY:
            raise HttpError(400, "bad_request", f"on_busy must be one of {', '.join(ON_BUSY)}")
        return given[-1]  # type: ignore[return-value]

    async def _health(self) -> dict[str, Any]:
        health = await self.backend.health()
        circle = self.cantrip.circle
        return {
            "ok": True,
            "mode": health.mode,
            "running": health.running,
            "cantrip": self.cantrip.id,
            "medium": circle.medium.name,
            "gates": list(circle.gate_names),
            "persistent": health.persistent,
            "sessions": health.sessions,
        }

    def unavailable(self, code: str, message: str) -> HttpError:
        return unavailable(code, message, self.options.retry_after_s)


async def _lifespan(receive: Receive, send: Send) -> None:
    """What lives as long as the server is its backend's, opened by whoever serves
    the app (:mod:`._serve`): the lifespan only says it started and stopped."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first error of a group (however nested): the one the client is told."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
