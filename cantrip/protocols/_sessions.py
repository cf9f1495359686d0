"""Protocol sessions: summoned entities behind ids, shared by ACP and HTTP (PROD-1, PROD-7).

A :class:`SessionHub` owns the sessions of one cantrip. A session is a
summoned entity (ENTITY-5): each prompt is one cast on it, so a follow-up sees
everything before it. The session id *embeds* the entity id
(``session-<hex>`` for ``entity-<hex>``), so the mapping needs no table of its
own: when the cantrip's loom is a file, a session can be loaded again after a
restart of the process (:meth:`SessionHub.get` resumes the entity from its
loom thread, exactly as a supervisor restarts a crashed entity).

Every adapter goes through :meth:`SessionHub.prompt`, which is
``Entity.send`` plus three things an adapter needs: streaming events
(spec 7.5) delivered to the prompt's sink and to any subscriber, refusing a
second prompt while one runs, and :meth:`SessionHub.cancel`. The JSON shapes
of events, results and turns that HTTP and the CLI print live here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip._entity import CastResult, Entity
from cantrip._errors import CantripError
from cantrip._events import (
    Event,
    FinalResponse,
    MessageComplete,
    MessageStart,
    StepComplete,
    StepStart,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._redact import get_logger, redact_value
from cantrip.llm._contract import plain_json
from cantrip.loom._model import Turn

log = get_logger("cantrip.sessions")

SESSION_PREFIX = "session-"
ENTITY_PREFIX = "entity-"


class SessionError(Exception):
    """A request about a session that cannot be served; ``kind`` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "not_found" | "busy" | "full"
        self.message = message


def _now() -> float:
    """trio's clock (virtual under a MockClock); 0 outside a trio run."""
    try:
        return trio.current_time()
    except RuntimeError:
        return 0.0


def session_id_for(entity_id: str) -> str:
    return SESSION_PREFIX + entity_id.removeprefix(ENTITY_PREFIX)


def entity_id_for(session_id: str) -> str:
    """The entity behind a session id; an entity id is accepted as is."""
    if session_id.startswith(ENTITY_PREFIX):
        return session_id
    return ENTITY_PREFIX + session_id.removeprefix(SESSION_PREFIX)


@attrs.define(eq=False)
class Session:
    id: str
    entity: Entity
    running: trio.CancelScope | None = None
    sink: Callable[[Event], None] | None = None
    """The running prompt's own event sink."""
    subscribers: list[trio.MemorySendChannel[Event]] = attrs.field(factory=list)
    """Live listeners (HTTP ``/events``); each gets every event of every prompt."""
    last_used: float = 0.0
    """trio time of the last request that named it (idle eviction, protocols._limits)."""

    @property
    def entity_id(self) -> str:
        return self.entity.id

    def dispatch(self, event: Event) -> None:
        """The entity's event sink: the prompt's sink, then each subscriber."""
        if self.sink is not None:
            self.sink(event)
        for channel in list(self.subscribers):
            try:
                channel.send_nowait(event)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                self.subscribers.remove(channel)

    def subscribe(self) -> trio.MemoryReceiveChannel[Event]:
        """A channel of this session's events from now on; close it to unsubscribe."""
        self.subscribers[:] = [
            c for c in self.subscribers if c.statistics().open_receive_channels > 0
        ]
        send, receive = trio.open_memory_channel[Event](math.inf)
        self.subscribers.append(send)
        return receive


class SessionHub:
    """The sessions of one cantrip; every protocol adapter serves through one."""

    def __init__(self, spell: Cantrip) -> None:
        self.spell = spell
        self.sessions: dict[str, Session] = {}

    @property
    def persistent(self) -> bool:
        """Whether sessions survive the process: the loom is a file."""
        return getattr(self.spell.loom.store, "path", None) is not None

    async def aclose(self) -> None:
        for session in list(self.sessions.values()):
            self.cancel(session)
            await session.entity.aclose()
        self.sessions.clear()

    # -- sessions ----------------------------------------------------------------

    def new(self) -> Session:
        entity = self.spell.summon()
        return self._adopt(session_id_for(entity.id), entity)

    def get(self, session_id: str) -> Session:
        """A live session, or one resumed from the loom (after a restart)."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        entity_id = entity_id_for(session_id)
        record = self.spell.loom.entities.get(entity_id)
        if record is None or record.parent_entity_id is not None:
            raise SessionError("not_found", f"unknown session {session_id!r}")
        canonical = session_id_for(entity_id)
        if canonical in self.sessions:
            return self.sessions[canonical]
        log.info("session %s resumed from the loom", canonical)
        return self._adopt(canonical, self.spell.resume(entity_id))

    def only(self) -> Session:
        """The one live session (clients that leave out the session id)."""
        if len(self.sessions) != 1:
            raise SessionError(
                "not_found", f"a session id is required (there are {len(self.sessions)})"
            )
        return next(iter(self.sessions.values()))

    def _adopt(self, session_id: str, entity: Entity) -> Session:
        session = Session(session_id, entity, last_used=_now())
        entity.on_event = session.dispatch
        self.sessions[session_id] = session
        return session

    def history(self, session: Session) -> list[Turn]:
        """The session's thread, root to its latest turn (earlier casts included)."""
        leaf = session.entity.leaf
        return self.spell.loom.thread(leaf) if leaf is not None else []

    # -- prompts -----------------------------------------------------------------

    async def prompt(
        self, session: Session, intent: str, on_event: Callable[[Event], None] | None = None
    ) -> CastResult | None:
        """One cast on the session's entity; ``None`` if it was cancelled before it
        produced a result. A second prompt while one runs is refused ("busy").

        A runtime crash of the entity (not a gate failure, not an LLM error) is
        raised to the caller, and the session's entity is resumed from the loom
        -- what a supervisor does for a crashed child."""
        if session.running is not None:
            raise SessionError("busy", f"session {session.id} is already running a prompt")
        outcome: CastResult | None = None
        with trio.CancelScope() as scope:
            session.running = scope
            session.sink = on_event
            try:
                outcome = await session.entity.send(intent)
            except CantripError:
                raise
            except Exception:
                log.exception("session %s: the entity crashed; resuming it", session.id)
                crashed = session.entity
                session.entity = self.spell.resume(crashed.id)
                session.entity.on_event = session.dispatch
                with trio.CancelScope(shield=True):
                    await crashed.aclose()
                raise
            finally:
                session.running = None
                session.sink = None
        return outcome

    def cancel(self, session: Session) -> bool:
        """Cancel the session's running prompt; returns whether one was running.

        The cast is cut off and recorded as ``cancelled``; the session stays."""
        if session.running is None:
            return False
        if not session.entity.cancel():
            session.running.cancel()  # the cast had not started its loop yet
        return True


# -- JSON shapes -------------------------------------------------------------------

STOP_REASONS = {"max_tokens_total": "max_tokens", "cancelled": "cancelled"}


def stop_reason(outcome: CastResult | None) -> str:
    """ACP's ``stopReason`` for a cast (HTTP reports the same)."""
    if outcome is None:
        return "cancelled"
    if outcome.terminated:
        return "end_turn"
    return STOP_REASONS.get(outcome.reason or "", "max_turn_requests")


def result_dict(outcome: CastResult | None, session: Session | None = None) -> dict[str, Any]:
    """A cast's outcome as the CLI's ``--json`` and the HTTP API report it."""
    data: dict[str, Any]
    if outcome is None:
        data = {
            "result": None,
            "terminated": False,
            "truncated": True,
            "reason": "cancelled",
            "turns": 0,
            "entity_id": session.entity_id if session else None,
            "usage": None,
            "summary": "cancelled before the first turn",
        }
    else:
        data = {
            "result": plain_json(outcome.result),
            "terminated": outcome.terminated,
            "truncated": outcome.truncated,
            "reason": outcome.reason,
            "turns": len(outcome.turns),
            "entity_id": outcome.entity_id,
            "usage": outcome.usage.to_dict(),
            "summary": outcome.summary,
        }
    data["stop_reason"] = stop_reason(outcome)
    if session is not None:
        data["session_id"] = session.id
    return redact_value(data)  # type: ignore[no-any-return]


def turn_dict(turn: Turn) -> dict[str, Any]:
    return redact_value(turn.to_dict())  # type: ignore[no-any-return]


def event_dict(event: Event) -> dict[str, Any]:
    """A streaming event as JSON: ``{"type": ..., "entity_id": ..., ...}``."""
    data: dict[str, Any] = {"type": EVENT_TYPES.get(type(event), type(event).__name__)}
    data["entity_id"] = event.entity_id
    if isinstance(event, StepStart):
        data["sequence"] = event.sequence
    elif isinstance(event, MessageStart):
        data["attempt"] = event.attempt
    elif isinstance(event, TextDelta | ThinkingDelta):
        data["text"] = event.text
    elif isinstance(event, ToolCallEvent):
        data.update(
            call_id=event.call_id,
            name=event.name,
            arguments=plain_json(event.arguments),
            final=event.final,
        )
    elif isinstance(event, MessageComplete):
        response = event.response
        data.update(
            content=response.content,
            tool_calls=[
                {"id": c.id, "name": c.name, "arguments": plain_json(c.arguments)}
                for c in response.tool_calls
            ],
        )
    elif isinstance(event, UsageEvent):
        data["usage"] = event.usage.to_dict()
    elif isinstance(event, ToolResultEvent):
        data["record"] = event.record.to_dict()
    elif isinstance(event, StepComplete):
        if event.turn is not None:
            turn = event.turn
            data.update(
                turn_id=turn.id,
                sequence=turn.sequence,
                terminated=turn.terminated,
                truncated=turn.truncated,
                reason=turn.reason,
                observation=turn.observation,
            )
    elif isinstance(event, FinalResponse):
        data["result"] = plain_json(event.result)
    return redact_value(data)  # type: ignore[no-any-return]


EVENT_TYPES: dict[type[Event], str] = {
    StepStart: "step_start",
    MessageStart: "message_start",
    TextDelta: "text_delta",
    ThinkingDelta: "thinking_delta",
    ToolCallEvent: "tool_call",
    MessageComplete: "message_complete",
    UsageEvent: "usage",
    ToolResultEvent: "tool_result",
    StepComplete: "step_complete",
    FinalResponse: "final_response",
}
