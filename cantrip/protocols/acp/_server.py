"""The Agent Client Protocol (ACP v1.7) over JSON-RPC 2.0: a thin front end over the
session backend (:class:`~cantrip.protocols.sessions.SessionBackend`: in process, or
PostgreSQL's with ``cantrip acp --db URL``, whose casts run in ``cantrip worker``
processes).

Transport-independent core: :meth:`AcpServer.handle` takes one decoded JSON-RPC
message and returns the response (or ``None`` for a notification); ``session/update``
notifications and the agent's own requests go out through the ``notify`` callback. The
package is split by job: :mod:`._rpc` (JSON-RPC framing, a prompt's parameters),
:mod:`._updates` (session events to ``session/update``), :mod:`._asking` (a pause asked
of the client), :mod:`._listing` (``session/list`` from the loom), :mod:`._stdio` (the
line-delimited stdio transport), :mod:`._client` (the agent's own requests to the
client, waiting for their answers) and :mod:`._v2` (the v2 draft's prompt lifecycle).

What a session is, how prompts queue, steer, interrupt and roll back, how a cancel
finds its prompt and how a pause is answered are the backend's -- written once for
every front end (HTTP, AG-UI, A2A, the viewer, ``cantrip mcp``, and this). What is
ACP's:

* ``session/new`` creates a session; ``session/load`` replays its history from the
  loom (steering messages where they were inserted) before it answers;
  ``session/resume`` reattaches without the replay; ``session/list`` lists the loom's
  sessions (earlier processes' too), ``session/delete`` removes one's tree from it.
* ``session/prompt`` submits a prompt and streams its events as ``session/update``
  (text, thinking, tool calls, inserted messages, ``usage_update``); it answers with
  ACP's ``stopReason`` and the cast's answer under ``_meta.cantrip``. A prompt sent
  while one runs waits its turn (ACP's default); ``_meta.cantrip.onBusy`` may instead
  ``steer`` (the text is inserted into the running cast's next turn, answered at
  once), ``interrupt``, ``rollback`` or ``reject`` -- the backend's busy policies.
* A pause is asked of the client (:mod:`._asking`): an approval as
  ``session/request_permission``, a question as ``elicitation/create``; the answer goes
  to the backend, which continues the cast (a prompt of its own, followed in turn).
* ``session/cancel`` cancels the running prompt (and any question being asked for it);
  ``$/cancel_request`` naming a running ``session/prompt`` cancels that prompt, which
  answers ACP's ``-32800``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._cantrip import Cantrip
from cantrip._folding import effective_policy
from cantrip._outcome import CastResult, stop_reason
from cantrip._redact import get_logger
from cantrip.llm._contract import plain_json
from cantrip.protocols.acp import _listing, _v2
from cantrip.protocols.acp._asking import ask, elicitation_modes
from cantrip.protocols.acp._client import ClientRequests, Notify
from cantrip.protocols.acp._rpc import (
    INTERNAL,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    RpcError,
    on_busy,
    prompt_text,
    rpc_error,
)
from cantrip.protocols.acp._rpc import error_response as _error
from cantrip.protocols.acp._running import Running
from cantrip.protocols.acp._updates import (
    Translator,
    children_cost,
    message,
    replay,
    session_cost,
)
from cantrip.protocols.sessions._backend import (
    SessionBackend,
    SessionError,
    SessionEvent,
    SessionInfo,
    SessionRef,
    session_id_of,
)
from cantrip.protocols.sessions._ids import BadIdError, client_id
from cantrip.protocols.sessions._process import ProcessBackend
from cantrip.protocols.sessions._through import follow_through

log = get_logger("cantrip.acp")


class AcpServer:
    """One ACP agent: a cantrip, its sessions served by a session backend."""

    def __init__(
        self,
        spell: Cantrip,
        notify: Notify | None = None,
        *,
        backend: SessionBackend | None = None,
        protocol: str = "v1",
    ) -> None:
        self.spell = spell
        self._owned: ProcessBackend | None = None
        """The in-process backend this server made and runs (None: the caller's)."""
        if backend is None:
            backend = self._owned = ProcessBackend.serving(spell)
        self.backend: SessionBackend = backend
        self.offers_v2 = protocol == _v2.PROTOCOL_FLAG
        """``--protocol v2-draft``: v2 is negotiated with a client that asks for it."""
        self.v2: _v2.Connection | None = None
        """The v2 side of this connection, once negotiated."""
        self.tasks: trio.Nursery
        """This connection's own tasks (set while :meth:`running`)."""
        self._notify = notify
        self._client = ClientRequests(notify)
        """Requests this agent sends the client, waiting for their answers."""
        self._modes: frozenset[str] = frozenset()
        """The elicitation modes the client advertised at ``initialize``."""
        self._running: dict[Any, Running] = {}
        """``session/prompt`` requests being carried out, by JSON-RPC id."""
        self.cwd = os.getcwd()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AcpServer]:
        """Serve while the block runs: the backend's casts and gate providers (unless
        the backend is shared, run by its owner), and this connection's own tasks (a
        v2 client's followers and prompts)."""
        async with contextlib.AsyncExitStack() as stack:
            if self._owned is not None:
                await stack.enter_async_context(self._owned.running())
            self.tasks = await stack.enter_async_context(trio.open_nursery())
            try:
                yield self
            finally:
                self.tasks.cancel_scope.cancel()

    async def aclose(self) -> None:
        """Kept for callers that built a server without :meth:`running`."""
        if self._owned is not None:
            with trio.CancelScope(shield=True):
                await self._owned.hub.aclose()

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answer one JSON-RPC message; notifications return None."""
        if not isinstance(message, Mapping):
            return _error(None, INVALID_REQUEST, "a JSON-RPC message must be an object")
        msg_id = message.get("id")
        if not isinstance(message.get("method"), str):
            if msg_id is not None and ("result" in message or "error" in message):
                self._client.deliver(message)  # the client's answer to a request of ours
                return None
            return _error(msg_id, INVALID_REQUEST, "not a JSON-RPC request (needs a method)")
        method = str(message["method"])
        params = message.get("params")
        params = {} if params is None else params
        handler = _METHODS.get(method)
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")
            if not isinstance(params, Mapping):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            if method == "session/prompt":
                result = await self._prompt(params, msg_id)
            else:
                result = await handler(self, params)
        except RpcError as exc:
            log.debug("%s -> error %d: %s", method, exc.code, exc.message)
            return None if msg_id is None else _error(msg_id, exc.code, exc.message)
        except SessionError as exc:
            error = rpc_error(exc)
            return None if msg_id is None else _error(msg_id, error.code, error.message)
        if msg_id is None:
            return None
        return {"jsonrpc": "2.0", "id": msg_id, "result": result}

    # -- methods ---------------------------------------------------------------

    async def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        persistent = (await self.backend.health()).persistent
        asked = params.get("protocolVersion")
        if self.offers_v2 and isinstance(asked, int) and asked >= _v2.VERSION:
            self.v2 = _v2.Connection(self)
            self._modes = elicitation_modes({"clientCapabilities": params.get("capabilities")})
            return _v2.initialize(persistent)
        self._modes = elicitation_modes(params)
        sessions: dict[str, Any] = {"resume": {}, "list": {}, "close": {}}
        if persistent:
            sessions["delete"] = {}
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": persistent,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "sessionCapabilities": sessions,
            },
            "authMethods": [],
            "agentInfo": {"name": "cantrip", "title": "cantrip", "version": "0.1.0"},
        }

    async def _new_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A session that keeps the client's ``cwd`` (recorded on its casts, listed
        and reported back on resume and load)."""
        cwd = params.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise RpcError(INVALID_PARAMS, "cwd must be a string (an absolute path)")
        info, _ = await self.backend.create(cwd=cwd)
        log.info("session %s: new entity %s", info.session_id, info.entity_id)
        if self.v2 is not None:
            await self.v2.follow(info.session_id, [])
        return {"sessionId": info.session_id}

    async def _load_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session_id = await self._session_id(params, required=True)
        for turn in await self.backend.thread(session_id):
            for update in replay(turn):
                await self._update(session_id, update)
        info = await self.backend.find(session_id)
        log.info("session %s loaded (entity %s)", session_id, info.entity_id)
        return {"_meta": {"cantrip": {"entityId": info.entity_id, "cwd": self.where(info)}}}

    async def _resume_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Reattach to a session (from the loom after a restart) without replaying it."""
        session_id = await self._session_id(params, required=True)
        info = await self.backend.find(session_id)
        log.info("session %s resumed (entity %s)", session_id, info.entity_id)
        if self.v2 is not None:
            replaying = params.get("replayFrom") is not None
            thread = await self.backend.thread(session_id)
            await self.v2.follow(session_id, thread, replay=replaying)
        meta = {"entityId": info.entity_id, "turns": info.turns, "cwd": self.where(info)}
        return {"_meta": {"cantrip": meta}}

    def where(self, info: SessionInfo) -> str:
        """The session's working directory: the one it was created in (fixed then,
        whatever a later ``session/resume`` or ``session/load`` names), else the
        agent's own."""
        return info.cwd if info.cwd is not None else self.cwd

    async def _list_sessions(self, params: Mapping[str, Any]) -> dict[str, Any]:
        listed = _listing.in_cwd(await self.backend.summaries(), params, self.cwd)
        try:
            chunk, cursor = _listing.page(listed, params.get("cursor"))
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        answer: dict[str, Any] = {"sessions": [_listing.to_dict(s, self.cwd) for s in chunk]}
        if cursor is not None:
            answer["nextCursor"] = cursor
        return answer

    async def _delete_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session_id = self._named(params)
        await self.backend.delete(session_id)
        log.info("session %s deleted", session_id)
        return {}

    async def _close_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``session/close``: cancel its work as ``session/cancel`` does, wait for the
        prompt to end, then let go of what memory holds for it (its loom stays: a
        later ``session/resume`` or ``session/load`` finds it)."""
        session_id = await self._session_id(params, required=True)
        self._withdraw_asks(session_id)
        cancelled = await self.backend.cancel(session_id)
        if cancelled.cancelled and cancelled.prompt_id is not None:
            with contextlib.suppress(SessionError):  # how it ended is its prompt's to say
                await self.backend.result(session_id, cancelled.prompt_id)
        await self.backend.release(session_id)
        log.info("session %s closed", session_id)
        return {}

    def _withdraw_asks(self, session_id: str) -> None:
        """Withdraw the questions asked of the client for the session's prompts."""
        for running in self._running.values():
            if running.session_id == session_id and running.asking is not None:
                running.asking.cancel()

    async def _cancel(self, params: Mapping[str, Any]) -> None:
        session_id = await self._session_id(params)
        self._withdraw_asks(session_id)
        cancelled = await self.backend.cancel(session_id)
        if cancelled.cancelled:
            log.info("session %s: prompt cancelled", session_id)

    async def _cancel_request(self, params: Mapping[str, Any]) -> None:
        """``$/cancel_request``: a ``session/prompt`` still being carried out is
        cancelled and answers ``-32800``; any other request was answered already."""
        running = self._running.get(params.get("requestId"))
        if running is None:
            return
        running.cancelled = True
        if running.asking is not None:
            running.asking.cancel()
        if running.prompt_id is not None:
            await self.backend.cancel(running.session_id, prompt_id=running.prompt_id)

    # -- prompts ------------------------------------------------------------------

    async def _prompt(self, params: Mapping[str, Any], msg_id: Any = None) -> dict[str, Any]:
        info = await self._session(params)  # the prompt's one read of its session (issue 46)
        if self.v2 is not None:
            return await self.v2.prompt(info, prompt_text(params))
        return await self.run_prompt(info, prompt_text(params), on_busy(params), msg_id)

    async def prepare_prompt(
        self, message: Mapping[str, Any]
    ) -> dict[str, Any] | Callable[[], Awaitable[dict[str, Any] | None]]:
        """Check a ``session/prompt`` now and run it later: either the error response,
        or a coroutine function that runs it and answers.

        Transports that run prompts in the background use this, so the messages after
        a prompt (a cancel, above all) are read while it runs, and a prompt names the
        sessions that exist when it arrives, not when it starts."""
        msg_id = message.get("id")
        params = message.get("params")
        if self.v2 is not None:  # answered once accepted (a steer: once a turn takes it)

            async def accept() -> dict[str, Any] | None:
                return await self.handle(message)

            return accept
        try:
            if not isinstance(params, Mapping):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            info = await self._session(params)
            text = prompt_text(params)
            policy = on_busy(params)
        except RpcError as exc:
            return _error(msg_id, exc.code, exc.message)
        running = Running(info.session_id)
        if msg_id is not None:
            self._running[msg_id] = running  # a $/cancel_request from now on finds it

        async def run() -> dict[str, Any] | None:
            try:
                result = await self.run_prompt(info, text, policy, msg_id, running)
            except RpcError as exc:
                return None if msg_id is None else _error(msg_id, exc.code, exc.message)
            except SessionError as exc:
                error = rpc_error(exc)
                return None if msg_id is None else _error(msg_id, error.code, error.message)
            finally:
                self._running.pop(msg_id, None)
            return None if msg_id is None else {"jsonrpc": "2.0", "id": msg_id, "result": result}

        return run

    async def run_prompt(
        self,
        session: SessionRef,
        text: str,
        policy: str,
        msg_id: Any = None,
        running: Running | None = None,
    ) -> dict[str, Any]:
        """Submit the prompt and carry it out: its events as updates, its pauses asked
        of the client, until it ends. ``steer`` inserts the text into the running
        cast instead (a prompt when none runs). ``session``: as this request read it
        (handed down to every call of the prompt: not read again), or its id."""
        session_id = session_id_of(session)
        if policy == "steer":
            try:
                await self.backend.steer(session_id, text)
            except SessionError as exc:
                if exc.kind != "not_running":
                    raise
            else:
                info = await self._info(session)
                meta = {"entityId": info.entity_id, "steered": True}
                return {"stopReason": "end_turn", "_meta": {"cantrip": meta}}
            policy = "enqueue"
        running = running if running is not None else Running(session_id)
        running.session_id = session_id
        if msg_id is not None:
            self._running[msg_id] = running
        try:
            if running.cancelled:  # withdrawn before it was submitted
                raise RpcError(REQUEST_CANCELLED, "the prompt was cancelled ($/cancel_request)")
            translator = await self.translator(session)  # its cost: before the prompt's
            submitted = await self.backend.submit(session, text, on_busy=policy)  # type: ignore[arg-type]
            running.prompt_id = submitted.prompt_id
            cast = await self._carry(session_id, running, translator=translator, session=session)
        finally:
            if msg_id is not None:
                self._running.pop(msg_id, None)
        if running.cancelled:
            raise RpcError(REQUEST_CANCELLED, "the prompt was cancelled ($/cancel_request)")
        return await self._answer(session, cast)

    async def _carry(
        self,
        session_id: str,
        running: Running,
        *,
        stream: bool = True,
        translator: Translator | None = None,
        session: SessionRef | None = None,
    ) -> CastResult | None:
        """Follow the prompt and each continuation of it until it ends not paused
        (``stream``: its events as updates; a v2 connection's follower tells them).
        ``session``: as the request read it (its follows and results read it no more)."""
        ref = session if session is not None else session_id
        if translator is None:
            translator = await self.translator(ref)
        while True:
            assert running.prompt_id is not None
            await self._stream(ref, running.prompt_id, translator, tell=stream)
            try:
                outcome = await self.backend.result(ref, running.prompt_id)
            except SessionError as exc:
                if exc.kind in ("cast_failed", "crashed"):
                    raise RpcError(INTERNAL, exc.message) from None
                raise
            cast = outcome.cast
            if cast is None or cast.reason != "paused" or running.cancelled:
                return cast
            pauses = await self.backend.pauses(ref)
            if not pauses:
                return cast
            decision = await self._ask(session_id, pauses[0], running)
            if decision is None:  # cancelled while asking: the pause stays in the loom
                return None
            submitted = await self.backend.answer(session_id, pauses[0].pause_id, decision)
            if submitted is None:
                return cast
            running.prompt_id = submitted.prompt_id

    async def _info(self, session: SessionRef) -> SessionInfo:
        """The session as the request read it, or read now (named by id)."""
        return session if isinstance(session, SessionInfo) else await self.backend.find(session)

    async def translator(self, session: SessionRef) -> Translator:
        """A translator of the session's events, its cost so far read from the loom."""
        info = await self._info(session)
        translator = Translator(
            info.entity_id,
            self.context_window(),
            recorded=not self.backend.capabilities.token_events,
        )
        translator.cost = await self.backend.read_loom(
            functools.partial(session_cost, entity_id=info.entity_id)
        )
        return translator

    async def updates(self, translator: Translator, told: SessionEvent) -> list[dict[str, Any]]:
        """``told`` as updates. Where only recorded turns are told, the children of the
        checkpoints told before are charged (read from the loom) as the parent's next
        turn is: they ran in between (:attr:`Translator.delegated`)."""
        turn = told.turn
        own = turn is not None and turn.entity_id == translator.entity_id
        if translator.delegated and told.type == "step_complete" and own:
            checkpoints, translator.delegated = translator.delegated, []
            translator.charge(
                await self.backend.read_loom(
                    functools.partial(children_cost, checkpoints=checkpoints)
                )
            )
        return translator.updates(told)

    def context_window(self) -> int | None:
        """The model's window, as folding knows it (``usage_update``'s ``size``)."""
        policy = effective_policy(self.spell.folding, self.spell.llm)
        return policy.context_window if policy is not None else None

    async def _stream(
        self, session: SessionRef, prompt_id: str, translator: Translator, *, tell: bool = True
    ) -> None:
        """The prompt's events as updates (``tell``), until it ends; a question that
        waits in place (an MCP server's, its call still running) is asked meanwhile."""
        session_id = session_id_of(session)
        async with trio.open_nursery() as asks:
            follow = follow_through(self.backend, session, prompt_id=prompt_id)
            async with contextlib.aclosing(follow) as events:
                async for told in events:
                    for update in await self.updates(translator, told) if tell else ():
                        await self._update(session_id, update)
                    if told.type == "pause" and isinstance(told.data.get("pause"), Mapping):
                        pause = Pause.from_dict(told.data["pause"])
                        if pause.origin is not None:
                            asks.start_soon(self._answer_in_place, session_id, pause)
            asks.cancel_scope.cancel()  # the prompt ended: a question left is moot

    async def _answer_in_place(self, session_id: str, pause: Pause) -> None:
        decision = await ask(
            self.request_client, session_id, pause, self._modes, v2=self.v2 is not None
        )
        try:
            await self.backend.answer(session_id, pause.pause_id, decision)
        except PauseError as exc:  # a wrong answer: the server declines the question
            log.info("session %s: the answer was refused (%s)", session_id, exc)
            await self.backend.answer(session_id, pause.pause_id, Decision.deny(str(exc)))

    async def _ask(self, session_id: str, pause: Pause, running: Running) -> Decision | None:
        """The client's decision on a pause the prompt ended on; None if cancelled."""
        with trio.CancelScope() as scope:
            running.asking = scope
            try:
                return await ask(
                    self.request_client, session_id, pause, self._modes, v2=self.v2 is not None
                )
            finally:
                running.asking = None
        return None

    async def _answer(self, session: SessionRef, outcome: CastResult | None) -> dict[str, Any]:
        stop = stop_reason(outcome)
        if outcome is not None and outcome.truncated and stop != "cancelled":
            await self._update(session_id_of(session), message(outcome.summary or "truncated"))
        info = await self._info(session)
        meta: dict[str, Any] = {"entityId": info.entity_id, "reason": "cancelled"}
        if outcome is not None:
            meta = {
                "result": plain_json(outcome.result) if outcome.terminated else outcome.summary,
                "entityId": outcome.entity_id,
                "turns": len(outcome.turns),
                "reason": outcome.reason,
                "usage": outcome.usage.to_dict(),
                "costUsd": outcome.cost_usd,
            }
            if outcome.partial is not None:
                meta["partial"] = outcome.partial  # cut off by the token limit: not a result
        return {"stopReason": stop, "_meta": {"cantrip": meta}}

    # -- requests to the client -------------------------------------------------

    async def request_client(self, method: str, params: Mapping[str, Any]) -> Any:
        """Send the client a JSON-RPC request and wait for its result (:mod:`._client`)."""
        return await self._client.request(method, params)

    # -- sessions --------------------------------------------------------------

    def _named(self, params: Mapping[str, Any]) -> str:
        session_id = params.get("sessionId")
        if session_id is None:
            raise RpcError(INVALID_PARAMS, "sessionId is required")
        if not isinstance(session_id, str):
            raise RpcError(INVALID_PARAMS, "sessionId must be a string")
        try:
            return client_id(session_id, "sessionId")
        except BadIdError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None

    async def _session_id(self, params: Mapping[str, Any], *, required: bool = False) -> str:
        """The id of the session a request names (:meth:`_session`)."""
        return (await self._session(params, required=required)).session_id

    async def _session(self, params: Mapping[str, Any], *, required: bool = False) -> SessionInfo:
        """The session a request names (resumed from the loom if need be), as read now;
        without ``sessionId``, the one session there is."""
        if params.get("sessionId") is None and not required:
            known = await self.backend.sessions()
            if len(known) != 1:
                raise RpcError(
                    INVALID_PARAMS, f"sessionId is required ({len(known)} sessions exist)"
                )
            return known[0]
        session_id = self._named(params)
        try:
            return await self.backend.find(session_id)
        except SessionError as exc:
            raise rpc_error(exc) from None

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        if self._notify is None:
            return
        await self._notify(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session_id, "update": update},
            }
        )


async def _prompt_method(server: AcpServer, params: Mapping[str, Any]) -> Any:
    return await server._prompt(params)


_METHODS: dict[str, Callable[[AcpServer, Mapping[str, Any]], Awaitable[Any]]] = {
    "initialize": AcpServer._initialize,
    "session/new": AcpServer._new_session,
    "session/load": AcpServer._load_session,
    "session/resume": AcpServer._resume_session,
    "session/list": AcpServer._list_sessions,
    "session/delete": AcpServer._delete_session,
    "session/prompt": _prompt_method,
    "session/cancel": AcpServer._cancel,
    "session/close": AcpServer._close_session,
    "$/cancel_request": AcpServer._cancel_request,
}
