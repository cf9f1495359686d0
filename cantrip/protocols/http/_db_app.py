"""``cantrip serve --db URL``: the HTTP session API as a stateless replica over PostgreSQL.

The same routes, JSON shapes and OpenAPI document as the in-process server
(:mod:`cantrip.protocols.http._app`), behind the same request guard, but the
replica runs no entity. Sessions live in PostgreSQL (:mod:`._db_sessions`), a
prompt is work on the queue that a ``cantrip worker`` runs, and every read is a
query on the PostgreSQL loom. Any number of replicas can serve the same
database behind any load balancer; a replica that dies loses nothing but the
connections it held (the casts go on at the workers, and a retry with the same
``Idempotency-Key`` at another replica joins or replays them).

Waiting for a cast costs no thread: one ``LISTEN`` connection per replica
(:class:`._db_notify.Notifier`) hears the queue's notifications (work finished, work
cancelled, both carrying the entity id) and wakes the trio tasks waiting on
that entity; each waiter also re-checks the work's state every ``poll_s`` in
case a notification was missed. Every blocking psycopg call runs in
``trio.to_thread`` behind the store's ``CapacityLimiter``.

Streams carry what can cross processes: a ``step_complete`` event as each turn
lands in the loom (the replica tails the entity's turns, woken by the
notifications and polling every ``tail_s``), ``final_response`` and the
``result``. Token deltas, tool-call and usage events happen inside the worker
and are not carried.

Circles that pause for a human (approvals, ``ask_user``) work as in-process: the
worker that meets the pause records it in the loom and ends the work ``paused``
(it holds no slot or lease while the human thinks); the prompt answers with its
``pending`` calls; ``POST /sessions/{id}/pending/{pause_id}`` at any replica
queues the answer as work a worker carries out, and waits for the continued
cast's result (see SPEC "Pauses under workers").

Steering and double-texting too (SPEC "Steering and double-texting"): a message for
a running prompt is stored for the worker that runs it, and a second prompt's
``on_busy`` policy is applied in the database (:meth:`._db_sessions.DbSessions.enqueue`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._cantrip import Cantrip
from cantrip._events import FinalResponse, PauseEvent, StepComplete
from cantrip._outcome import CastResult, result_dict
from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage, is_connection_error
from cantrip.distributed._work import DEAD, PAUSED
from cantrip.loom._model import Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.a2a import _server as _a2a
from cantrip.protocols.a2a._handler import A2AFront
from cantrip.protocols.agui._run import serve_agui
from cantrip.protocols.asgi._openapi import CancelRequest, openapi_document
from cantrip.protocols.asgi._requests import (
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
    sse_error,
)
from cantrip.protocols.http._shell import ServerShell, serve_asgi, start_prompt_stream
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.middleware._lifecycle import Drain, ServeOptions, Tally
from cantrip.protocols.sessions._hub import SessionError, event_dict
from cantrip.protocols.sessions._notify import Notifier
from cantrip.protocols.sessions._postgres import PostgresBackend
from cantrip.protocols.sessions._rows import (
    DbSessions,
    Progress,
    Queued,
    SessionRow,
    failure_message,
    prompt_id_for,
)
from cantrip.protocols.sessions._tail import follow, while_connected
from cantrip.protocols.viewer._app import Viewer

log = get_logger("cantrip.http")

DB_UNAVAILABLE = "database_unavailable"
"""The error code of a ``503`` answered while the database is unreachable."""


class DbHttpApp(ServerShell):
    """The ASGI application of one ``serve --db`` replica."""

    def __init__(
        self,
        spell: Mapping[str, Any],
        cantrip: Cantrip,
        sessions: DbSessions,
        notifier: Notifier,
        options: ServeOptions | None = None,
        *,
        poll_s: float = 2.0,
        tail_s: float = 0.25,
    ) -> None:
        self.spell = dict(spell)
        """The queued spell (the spec's contents) every prompt is enqueued with."""
        self.cantrip = cantrip
        """The spec built once at start-up: what ``/health`` describes."""
        self.sessions = sessions
        self.notifier = notifier
        self.options = options or ServeOptions()
        self.poll_s = poll_s
        self.tail_s = tail_s
        self.drain = Drain()
        self._outage = Outage("serve --db", log)
        store = sessions.store
        self.viewer = Viewer.over(PostgresBackend(sessions, notifier, spell), str(store))
        """The browser viewer at / and /api/, read-only over the PostgreSQL loom (its
        queries in threads behind the store's limiter)."""
        self._waits = Tally()
        """Prompts this replica is waiting on (``/health``, ``max_running``, shutdown)."""
        self.a2a: A2AFront | None = None
        """A2A's card and endpoint (set by :func:`serve_http_db` when the SDK is there)."""

    @property
    def waiting(self) -> int:
        """How many prompts this replica is waiting on (``max_running`` bounds it)."""
        return self._waits.count

    async def _before_route(self, scope: Scope, receive: Receive, send: Send) -> bool:
        if self.a2a is not None and await self.a2a.dispatch(scope, receive, send):
            return True  # A2A (protocols.a2a, over the PostgreSQL backend)
        return await self.viewer.dispatch(scope, receive, send)  # the browser viewer

    async def _agui(self, receive: Receive, send: Send) -> None:
        @contextlib.asynccontextmanager
        async def admitted() -> AsyncIterator[None]:
            limit = self.options.max_running
            if limit is not None and self.waiting >= limit:
                raise self._unavailable(
                    "overloaded", f"{self.waiting} prompts are waiting here (the limit); try again"
                )
            with self._waits.held():  # a prompt this replica waits on
                yield

        backend = PostgresBackend(
            self.sessions, self.notifier, self.spell, poll_s=self.poll_s, tail_s=self.tail_s
        )
        await serve_agui(
            backend,
            receive,
            send,
            gate_names=self.cantrip.circle.gate_names,
            admitted=admitted,
            drain=self.drain,
        )

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking database call in a thread, behind the store's limiter.

        The HTTP boundary of the database (issue 28.5, 29.2): every psycopg error becomes
        the API's JSON error here, never a bare 500 with an empty body. A lost connection
        is ``503`` + ``Retry-After`` (the database restarts, fails over): said once in the
        log, and once again when a call succeeds. Input PostgreSQL still cannot hold
        (``DataError``) is a 400, any other database error a 500 ``database_error``, each
        logged once here."""
        import psycopg

        limiter = self.sessions.store.limiter
        try:
            result = await trio.to_thread.run_sync(fn, *args, limiter=limiter)
        except Exception as exc:
            if isinstance(exc, psycopg.DataError):
                log.info("input the database cannot hold: %s", _first_line(exc))
                raise HttpError(
                    400, "bad_request", f"the database cannot hold this input: {_first_line(exc)}"
                ) from None
            if not is_connection_error(exc):
                if isinstance(exc, psycopg.Error):
                    log.error("database error (%s): %s", type(exc).__name__, _first_line(exc))
                    raise HttpError(
                        500, "database_error", f"the database failed: {type(exc).__name__}"
                    ) from None
                raise
            self._outage.failed(exc)
            with contextlib.suppress(Exception):  # drop the pool's broken connections
                await trio.to_thread.run_sync(self.sessions.store.pool.check, limiter=limiter)
            raise self._unavailable(
                DB_UNAVAILABLE, "the database is unreachable; try again shortly"
            ) from None
        self._outage.ok()
        return result

    async def _db_waiting(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`_db` for a request that waits on a cast: while the database is away it
        keeps waiting (the cast goes on once it is back) instead of answering 503."""
        while True:
            try:
                return await self._db(fn, *args)
            except HttpError as exc:
                if exc.code != DB_UNAVAILABLE:
                    raise
            await trio.sleep(self.poll_s)

    async def _a2a_admit(self, session_id: str | None) -> None:
        """The replica's limits before A2A queues a prompt, as for its own."""
        if self.drain.closing:
            raise SessionError("shutting_down", "the server is shutting down")
        limit = self.options.max_running
        if limit is not None and self.waiting >= limit:
            raise SessionError(
                "overloaded", f"{self.waiting} prompts are waiting here (the limit); try again"
            )

    async def _create(self, key: str | None) -> tuple[dict[str, Any], bool]:
        row, created = await self._db(self.sessions.create, key)
        return row.info(), created

    async def _list(self) -> list[dict[str, Any]]:
        return [r.info() for r in await self._db(self.sessions.all)]

    def _info(self, row: SessionRow) -> dict[str, Any]:
        return row.info()

    async def _prompt_result(
        self,
        row: SessionRow,
        intent: str,
        key: str | None,
        on_busy: str,
        scope: Scope,
        receive: Receive,
    ) -> dict[str, Any] | None:
        """The worker's result; None if the client hung up first (the work goes on)."""
        work_id = await self._enqueue(row, intent, key, on_busy)  # busy etc. answer here
        answer: dict[str, Any] = {}
        with self._waits.held():
            async with trio.open_nursery() as nursery:

                async def hang_up() -> None:
                    await until_disconnect(receive)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(hang_up)
                try:
                    answer["result"] = await self._finished(row, work_id)
                except HttpError as exc:  # raised out of here, not as an exception group
                    answer["error"] = exc
                nursery.cancel_scope.cancel()
        if "error" in answer:
            raise answer["error"]
        if "result" not in answer:
            return None
        return {**answer["result"], "prompt_id": prompt_id_for(work_id)}

    def _openapi(self) -> dict[str, Any]:
        return openapi_document("cantrip serve --db")

    async def _steer(self, row: SessionRow, text: str) -> dict[str, Any]:
        """Queue the message for the prompt's worker: 202 if a prompt of the session is
        open (queued or running), decided in the database, 409 ``not_running`` if not."""
        try:
            answer: dict[str, Any] = await self._db(self.sessions.steer, row.entity_id, text)
        except SessionError as exc:
            raise self._session_error(exc) from None
        return answer

    async def _pending_calls(self, row: SessionRow) -> list[dict[str, Any]]:
        pending: list[dict[str, Any]] = await self._db(self.sessions.pending, row.entity_id)
        return pending

    async def _cancel(self, row: SessionRow, target: CancelRequest) -> dict[str, Any]:
        cancelled: dict[str, Any] = await self._db(
            self.sessions.cancel,
            row.entity_id,
            target.prompt_id,
            target.idempotency_key,
            target.next,
        )
        return cancelled

    async def _turns(self, row: SessionRow) -> list[dict[str, Any]]:
        return [
            t.to_dict() for t in await self._db(self.sessions.thread, row.entity_id)
        ]  # redacted by json_response

    async def _health_report(self) -> dict[str, Any]:
        circle = self.cantrip.circle
        return {
            "ok": True,
            "mode": "db",
            "running": self.waiting,
            "cantrip": self.cantrip.id,
            "medium": circle.medium.name,
            "gates": list(circle.gate_names),
            "persistent": True,
            "sessions": await self._db(self.sessions.count),
        }

    async def _session(self, session_id: str) -> SessionRow:
        try:
            row: SessionRow = await self._db(self.sessions.require, session_id)
        except SessionError as exc:
            raise self._session_error(exc) from None
        return row

    # -- prompts -----------------------------------------------------------------

    async def _enqueue(
        self,
        row: SessionRow,
        intent: str,
        key: str | None,
        on_busy: str = "reject",
        spell: dict[str, Any] | None = None,
        also: Callable[[Any, int], None] | None = None,
    ) -> int:
        """Queue a prompt, following ``on_busy`` if one runs (with ``spell`` in place of
        the served one: a front end's tools added); its work id."""
        if self.drain.closing:
            raise self._unavailable("shutting_down", "the server is shutting down")
        limit = self.options.max_running
        if limit is not None and self.waiting >= limit:
            raise self._unavailable(
                "overloaded", f"{self.waiting} prompts are waiting here (the limit); try again"
            )
        try:
            queued = await self._db(
                self.sessions.enqueue,
                row.entity_id,
                spell or self.spell,
                intent,
                key,
                on_busy,
                also,
            )
        except SessionError as exc:
            raise self._session_error(exc) from None
        log.debug("session %s: work %d (%s)", row.session_id, queued.work_id,
                  "joined" if queued.replayed else "queued")  # fmt: skip
        return int(queued.work_id)

    async def _finished(self, row: SessionRow, work_id: int) -> dict[str, Any]:
        """Wait for the work to end; its result in the in-process server's shape."""
        ended = await self._wait(row.entity_id, work_id)
        return await self._result(row, work_id, ended)

    async def _wait(self, entity_id: str, work_id: int) -> Progress:
        """Until the work ends: woken by NOTIFY, checking every ``poll_s`` regardless."""
        with self.drain.stream() as closing, self.notifier.watching(entity_id) as next_event:
            while not closing.cancel_called:
                woken = next_event()  # before the check: none is missed
                progress: Progress = await self._db_waiting(self.sessions.progress, work_id)
                if progress.ended:
                    return progress
                with trio.move_on_after(self.poll_s):
                    await woken.wait()
        raise self._unavailable(
            "shutting_down",
            "this replica is shutting down; the cast goes on at its worker: send the "
            "request again (with the same Idempotency-Key) to get its result",
        )

    async def _result(self, row: SessionRow, work_id: int, ended: Progress) -> dict[str, Any]:
        if ended.state == "failed":
            raise HttpError(500, "cast_failed", failure_message(ended.outcome))
        if ended.state == DEAD:  # no worker could finish it within the attempt limit
            raise HttpError(500, "cast_dead_lettered", failure_message(ended.outcome))
        cast: CastResult | None
        cast, undelivered = await self._db(
            self.sessions.outcome, row.entity_id, work_id, ended.base_pos
        )
        data = result_dict(cast)
        if undelivered and cast is None:  # sent while it was queued; it never began
            data["undelivered"] = undelivered
        data["session_id"] = row.session_id
        if data.get("entity_id") is None:
            data["entity_id"] = row.entity_id
        return data

    async def _answer(
        self, row: SessionRow, pause_id: str, decision: Decision
    ) -> dict[str, Any] | None:
        """Queue the answer (409 if the pause is not waiting: answered already, here or
        at another replica) and wait for the continued cast, like a prompt."""
        if self.drain.closing:
            raise self._unavailable("shutting_down", "the server is shutting down")
        try:
            queued: Queued = await self._db(
                self.sessions.answer, row.entity_id, pause_id, decision.to_dict()
            )
        except PauseError as exc:
            raise HttpError(409, "pause_answered", str(exc)) from None
        log.debug("session %s: answer %s queued as work %d", row.session_id, pause_id,
                  queued.work_id)  # fmt: skip
        if queued.replayed:  # handed to the running prompt, which answers with its result
            return None
        with self._waits.held():
            return await self._finished(row, queued.work_id)

    async def _prompt_stream(
        self,
        row: SessionRow,
        intent: str,
        key: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        cancel_on_disconnect: bool,
        on_busy: str,
    ) -> None:
        work_id = await self._enqueue(row, intent, key, on_busy)
        prompt_id = prompt_id_for(work_id)
        with self._waits.held():
            await start_prompt_stream(send, prompt_id, row.session_id, key)

            async def cancel() -> None:
                log.info("session %s: the client hung up; cancelling its prompt", row.session_id)
                await self._db(self.sessions.cancel, row.entity_id, prompt_id)

            followed = await while_connected(
                self.drain,
                receive,
                lambda: self._tail(row, work_id, send),
                cancel if cancel_on_disconnect else None,
            )
            if followed.gone:
                return  # the work goes on at its worker; nobody to tell
            ended = followed.ended
            try:
                if ended is None:
                    raise self._unavailable(
                        "shutting_down",
                        "this replica is shutting down; the cast goes on at its worker",
                    )
                final = {**await self._result(row, work_id, ended), "prompt_id": prompt_id}
            except HttpError as exc:
                await sse_error(send, exc)
            else:
                await sse(send, "result", final)
            await end_body(send)

    async def _tail(self, row: SessionRow, work_id: int, send: Send) -> Progress:
        """Send each turn of the work as it lands in the loom, until the work ends; then
        ``pause`` for each call it ended waiting on (it ended ``paused``). A pause the
        running tree waits on in place (a child's) is sent as its worker publishes it.
        The work's turns are the entity's after the position its first claim recorded
        (a prompt queued behind another begins where that one ended), up to the next
        cast's (:mod:`._db_follow`)."""
        sent: set[str] = set()
        turns = follow(self, row.entity_id, self._db_waiting, work_id=work_id)
        async with contextlib.aclosing(turns):
            async for item in turns:
                if isinstance(item, Turn):
                    await _send_turn(send, item)
                elif item.last:
                    assert item.progress is not None
                    if item.progress.state == PAUSED:
                        pending = (item.progress.outcome or {}).get("pending") or []
                        await _send_pauses(send, pending, sent)
                    return item.progress
                elif self.cantrip.circle.needs_humans:
                    live = await self._db(self.sessions.live_pending, row.entity_id)
                    await _send_pauses(send, live, sent)
        raise AssertionError("following a work item ends with its last beat")

    async def _events(self, row: SessionRow, receive: Receive, send: Send) -> None:
        """Every turn of the session from now on, as it lands in the loom."""
        seen: int = await self._db(self.sessions.last_pos, row.entity_id)

        async def pump(closing: trio.CancelScope) -> None:
            quiet_since = trio.current_time()
            humans = self.cantrip.circle.needs_humans
            sent = {p["pause_id"] for p in await self._pending(row, humans)}  # not news
            turns = follow(
                self, row.entity_id, self._db, after=seen, stop=lambda: closing.cancel_called
            )
            async with contextlib.aclosing(turns):
                async for item in turns:
                    if isinstance(item, Turn):
                        quiet_since = trio.current_time()
                        await _send_turn(send, item)
                        continue
                    if item.heard or item.landed:  # a NOTIFY (work ended, a pause) or turns
                        await _send_pauses(send, await self._pending(row, humans), sent)
                    if trio.current_time() - quiet_since >= heartbeat_s():
                        quiet_since = trio.current_time()
                        await sse_comment(send, "idle")

        await self._event_stream(receive, send, pump)

    async def _pending(self, row: SessionRow, humans: bool) -> list[dict[str, Any]]:
        """The calls the session waits on a human for (none asked if its circle never
        pauses)."""
        if not humans:
            return []
        pending: list[dict[str, Any]] = await self._db(self.sessions.pending, row.entity_id)
        return pending

    async def shutdown(self) -> None:
        """Stop taking requests; give open waits the grace period, then answer them
        503 (their casts go on at the workers); end every event stream."""
        self.drain.begin(self.options.grace_s)
        with trio.move_on_after(self.options.grace_s):
            await self._waits.empty()
        await self.drain.end_streams(self.options.answer_timeout_s)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


async def _send_turn(send: Send, turn: Turn) -> None:
    """What a recorded turn tells a stream: ``step_complete``, and the result if it ended
    the cast -- the same JSON as the in-process server's events."""
    events = [event_dict(StepComplete(turn, entity_id=turn.entity_id))]
    if turn.terminated:
        events.append(event_dict(FinalResponse(turn.result, entity_id=turn.entity_id)))
    for event in events:
        await sse(send, event["type"], event)


async def _send_pauses(send: Send, pauses: list[dict[str, Any]], sent: set[str]) -> None:
    """``event: pause`` for each pause not sent yet -- the in-process server's event and
    payload (``{"type": "pause", "entity_id": <the pausing entity>, "pause": {...}}``)."""
    for data in pauses:
        if data["pause_id"] in sent:
            continue
        sent.add(data["pause_id"])
        pause = Pause.from_dict(data)
        event = event_dict(PauseEvent(pause=pause, entity_id=pause.entity_id))
        await sse(send, event["type"], event)


# -- serving --------------------------------------------------------------------------


async def serve_http_db(
    spell: Mapping[str, Any],
    cantrip: Cantrip,
    url: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    read_timeout_s: int = 30,
    max_connections: int = 8,
) -> None:
    """Serve the HTTP API of ``cantrip serve --db`` until ``shutdown_trigger`` returns
    (or the task is cancelled); ``task_status`` gets the bound URLs."""
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    store = await trio.to_thread.run_sync(
        lambda: PostgresStore(url, max_connections=max_connections)
    )
    try:
        options = options or ServeOptions()
        sessions = await trio.to_thread.run_sync(
            lambda: DbSessions(store, sticky_cancel_s=options.sticky_cancel_s)
        )
        notifier = Notifier(url)
        app = DbHttpApp(spell, cantrip, sessions, notifier, options)
        if await trio.to_thread.run_sync(_a2a.available):  # the SDK's import, off the loop
            backend = PostgresBackend(
                sessions, notifier, spell, poll_s=app.poll_s, tail_s=app.tail_s
            )
            app.a2a = A2AFront(cantrip, backend, admit=app._a2a_admit)
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            await serve_asgi(
                app,
                _a2a.jsonrpc_refusals(guard.wrap(app)),
                host,
                port,
                shutdown_trigger=shutdown_trigger,
                read_timeout_s=read_timeout_s,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)
