"""The ACP v2 draft (schema 2.0.0-alpha, published beside v1; ``cantrip acp
--protocol v2-draft``, negotiated only with a client that asks for version 2).

What the draft changes, mapped onto what the session backend already does:

* **A prompt is acknowledged, not awaited.** ``session/prompt`` answers
  ``{"messageId": ...}`` once the message is accepted: sent to an idle session it is
  submitted as a prompt whose idempotency key is its message id (so the loom records the
  id with the intent); sent while the session works it is a steering message,
  accepted when a turn takes it -- its id then names that turn
  (``<turn id>:steer:<n>``). A message no turn took before the cast ended is submitted
  as the next prompt (``enqueue``), as the draft's queued input.
* **An explicit idle state.** ``state_update`` ``running`` when a cast's turn starts,
  ``requires_action`` when it waits on a person, ``idle`` with the ``stopReason`` when
  it ends -- read from the session's events, so every client sees the same states.
* **Inserted messages are replayed where they were inserted**, from the loom:
  ``session/resume`` with ``replayFrom`` replays the thread, each user message with its
  id (the intent's key, or ``<turn id>:intent``; a steering message's turn id).
* **Several clients observe one session.** Each connection that creates or resumes a
  session follows it (``SessionBackend.follow``) and is told everything any client's
  prompt does; the connection that sent a prompt also answers its pauses.

The updates are v1's translation (:mod:`._updates`) reshaped: every chunk carries a
message id, and a tool call is a ``tool_call_update`` upsert.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

import trio

from cantrip._outcome import CastResult, stop_reason_for
from cantrip._redact import get_logger
from cantrip.loom._model import Turn
from cantrip.protocols.acp._rpc import RpcError
from cantrip.protocols.acp._running import Running
from cantrip.protocols.acp._updates import Translator, replay
from cantrip.protocols.sessions._backend import (
    SessionBackend,
    SessionError,
    SessionEvent,
    SessionInfo,
    SessionRef,
)
from cantrip.protocols.sessions._idempotency import KEY_TAG
from cantrip.protocols.sessions._through import follow_through


class Host(Protocol):
    """What a v2 connection needs of its server (:class:`~._server.AcpServer`)."""

    backend: SessionBackend
    tasks: trio.Nursery
    _running: dict[Any, Running]

    def context_window(self) -> int | None: ...
    async def translator(self, session: SessionRef) -> Translator: ...
    async def updates(self, translator: Translator, told: SessionEvent) -> list[dict[str, Any]]: ...
    async def _update(self, session_id: str, update: dict[str, Any]) -> None: ...
    async def _carry(
        self,
        session_id: str,
        running: Running,
        *,
        stream: bool = True,
        session: SessionRef | None = None,
    ) -> CastResult | None: ...


log = get_logger("cantrip.acp")

VERSION = 2
PROTOCOL_FLAG = "v2-draft"


def initialize(persistent: bool) -> dict[str, Any]:
    """The v2 ``initialize`` answer (``info`` and ``capabilities`` replace v1's names)."""
    session: dict[str, Any] = {"resume": {}, "list": {}}
    if persistent:
        session["delete"] = {}
    return {
        "protocolVersion": VERSION,
        "info": {"name": "cantrip", "title": "cantrip", "version": "0.1.0"},
        "capabilities": {"session": session},
        "authMethods": [],
    }


def intent_id(turn: Turn) -> str:
    """A recorded intent's message id: the key it was submitted with (a v2 prompt's
    message id), else one named by its turn."""
    key = turn.extras.get(KEY_TAG)
    return key if isinstance(key, str) else f"{turn.id}:intent"


def reshape(update: Mapping[str, Any], message_id: str) -> dict[str, Any]:
    """A v1 update as v2 has it: chunks carry a message id, a tool call is an upsert."""
    out = dict(update)
    kind = out.get("sessionUpdate")
    if kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk"):
        out.setdefault("messageId", f"{message_id}:{kind.split('_')[1]}")
    elif kind == "tool_call":
        out["sessionUpdate"] = "tool_call_update"
    return out


def state(value: str, stop: str | None = None) -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": "state_update", "state": value}
    if stop is not None:
        update["stopReason"] = stop
    return update


def user_message(message_id: str, text: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "user_message",
        "messageId": message_id,
        "content": [{"type": "text", "text": text}],
    }


def replay_turn(turn: Turn) -> list[dict[str, Any]]:
    """A recorded turn as v2 updates: its intent as a ``user_message`` with its id,
    steering messages with theirs, then what the agent said and did."""
    out: list[dict[str, Any]] = []
    if turn.intent:
        out.append(user_message(intent_id(turn), turn.intent))
    for update in replay(turn):
        if update.get("sessionUpdate") == "user_message_chunk":
            if "messageId" not in update:
                continue  # the intent, told above as a whole message
            text = update["content"]["text"]
            out.append(user_message(update["messageId"], text))
            continue
        out.append(reshape(update, turn.id))
    return out


class States:
    """The session's state as the draft names it, read from its events.

    A cast that ends by ``done`` is idle only after its ``final_response`` (the event
    that follows the last ``step_complete`` and carries the answer): told at the
    ``step_complete``, ``idle`` reached a client before the reply it ends."""

    def __init__(self) -> None:
        self.now = "idle"
        self._ending: dict[str, Any] | None = None
        """The ``idle`` update waiting for the ended cast's ``final_response``."""

    def after(self, told: SessionEvent) -> list[dict[str, Any]]:
        if told.type == "step_start" and self.now != "running":
            self.now = "running"
            return [state("running")]
        if told.type == "pause":
            self.now = "requires_action"
            return [state("requires_action")]
        if told.type == "final_response" and self._ending is not None:
            ending, self._ending = self._ending, None
            return [ending]
        turn = told.turn
        ended = turn is not None and (turn.terminated or turn.truncated)
        if told.type == "step_complete" and turn is not None and ended and turn.reason != "paused":
            self.now = "idle"
            idle = state("idle", stop_reason_for(turn.terminated, turn.reason))
            if turn.terminated:  # its final_response comes next
                self._ending = idle
                return []
            return [idle]
        return []


class Connection:
    """The v2 side of one client's connection: the sessions it follows, the steering
    messages it sent that wait for a turn, and its prompts carried in the background."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.followed: set[str] = set()
        self.told: set[str] = set()
        """User message ids this connection was told (its own, as it sent them)."""
        self.steering: dict[str, list[_Steer]] = {}
        """Per session: the steering messages sent here that no turn has taken yet."""

    async def follow(self, session_id: str, thread: list[Turn], *, replay: bool = False) -> None:
        """Tell this client the session's events from now on (after ``thread``,
        replayed first when asked) -- whoever's prompt they come from."""
        if replay:
            for turn in thread:
                for update in replay_turn(turn):
                    await self.server._update(session_id, update)
        if session_id in self.followed:
            return
        self.followed.add(session_id)
        await self.server.tasks.start(self._follow, session_id, len(thread))

    async def _follow(
        self, session_id: str, after: int, *, task_status: trio.TaskStatus[None]
    ) -> None:
        backend = self.server.backend
        info = await backend.find(session_id)
        translator = await self.server.translator(info)
        events = follow_through(backend, info, after)
        task_status.started()
        try:
            await self._tell(session_id, events, translator, info.entity_id)
        except SessionError as exc:  # the session went (deleted): nothing more to tell
            log.info("session %s is no longer followed: %s", session_id, exc.message)
        finally:
            self.followed.discard(session_id)

    async def _tell(
        self,
        session_id: str,
        events: AsyncGenerator[SessionEvent, None],
        translator: Translator,
        entity_id: str,
    ) -> None:
        states = States()
        async with contextlib.aclosing(events):
            async for told in events:
                turn = told.turn
                if told.type == "step_complete" and turn is not None and turn.intent:
                    message_id = intent_id(turn)
                    if message_id not in self.told:  # another client's prompt
                        self.told.add(message_id)
                        await self.server._update(session_id, user_message(message_id, turn.intent))
                for update in await self.server.updates(translator, told):  # a message a turn
                    message_id = f"{entity_id}:{translator.sequence}"
                    await self.server._update(session_id, reshape(update, message_id))
                if told.type == "step_complete" and turn is not None:
                    self._taken(session_id, turn)
                for update in states.after(told):
                    await self.server._update(session_id, update)
                    if update.get("state") == "idle":
                        await self._requeue(session_id)

    def _taken(self, session_id: str, turn: Turn) -> None:
        """The steering messages ``turn`` took are accepted, with their ids."""
        taken = turn.extras.get("steering")
        waiting = self.steering.get(session_id, [])
        for n, _ in enumerate(taken if isinstance(taken, list) else []):
            if waiting:
                waiting.pop(0).accept(f"{turn.id}:steer:{n}")

    async def _requeue(self, session_id: str) -> None:
        """Messages no turn took before the cast went idle become the next prompts."""
        waiting = self.steering.pop(session_id, [])
        for steer in waiting:
            steer.accept(await self._submit(session_id, steer.text))

    async def prompt(self, info: SessionInfo, text: str) -> dict[str, Any]:
        """Accept a message: a prompt if the session is idle (``info``: as this request
        read it, handed down), else inserted into the running cast; answered with its
        message id once accepted."""
        session_id = info.session_id
        if info.running:
            steer = _Steer(text)
            self.steering.setdefault(session_id, []).append(steer)
            try:
                await self.server.backend.steer(session_id, text)
            except SessionError as exc:
                self.steering[session_id].remove(steer)
                if exc.kind != "not_running":
                    raise
            else:
                await steer.accepted.wait()
                assert steer.message_id is not None
                return {"messageId": steer.message_id}
        return {"messageId": await self._submit(session_id, text, info)}

    async def _submit(self, session_id: str, text: str, info: SessionInfo | None = None) -> str:
        """Submit a prompt (``info``: the session as the request read it, if it did)."""
        message_id = "msg-" + secrets.token_hex(8)
        self.told.add(message_id)
        await self.server._update(session_id, user_message(message_id, text))
        ref: SessionRef = info if info is not None else session_id
        submitted = await self.server.backend.submit(ref, text, key=message_id, on_busy="enqueue")
        running = Running(session_id, submitted.prompt_id)
        self.server._running[message_id] = running  # a session/cancel withdraws its asks
        self.server.tasks.start_soon(self._carry, session_id, running, message_id, ref)
        return message_id

    async def _carry(
        self, session_id: str, running: Running, message_id: str, ref: SessionRef
    ) -> None:
        """The prompt's pauses asked of this client; its events are the followers'."""
        try:
            await self.server._carry(session_id, running, stream=False, session=ref)
        except (RpcError, SessionError) as exc:  # told as the session's idle state
            log.info("session %s: a v2 prompt failed: %s", session_id, exc)
        finally:
            self.server._running.pop(message_id, None)


class _Steer:
    """A steering message waiting for the turn that takes it (or the next prompt)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.message_id: str | None = None
        self.accepted = trio.Event()

    def accept(self, message_id: str) -> None:
        self.message_id = message_id
        self.accepted.set()
