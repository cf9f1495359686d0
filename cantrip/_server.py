"""A long-lived, supervised entity: intents arrive in an inbox, each one a cast.

This is the shape ``invoke`` and protocol sessions run on. The entity's main
loop is a supervisor child: if the entity crashes (a runtime bug, not a gate
failure), the crash is recorded in the loom, the caller waiting on that cast
gets the error, and the supervisor starts a new incarnation that resumes from
the last committed turn -- state rebuilt from the loom, not from memory.
"""

from __future__ import annotations

import math

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip._core import Entity, PauseHandler
from cantrip._errors import CantripError
from cantrip._events import EventSink
from cantrip._outcome import CastResult
from cantrip._supervisor import ChildSpec, Restart, Supervisor
from cantrip.loom._model import new_entity_id


@attrs.define(eq=False)
class _Request:
    intent: str
    reply: trio.MemorySendChannel[CastResult | BaseException]


class EntityServer:
    """A summoned entity behind an inbox, meant to run under a :class:`Supervisor`.

    Transient by default: closing the inbox ends it normally and for good; a
    crash restarts it. ``on_event`` receives the streaming events of every
    incarnation (spec 7.5); :meth:`cancel` cuts off the cast running now (it
    is recorded as cancelled and the entity stays alive for the next intent).
    """

    def __init__(
        self,
        spell: Cantrip,
        *,
        entity_id: str | None = None,
        restart: Restart = Restart.TRANSIENT,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
    ) -> None:
        self.spell = spell
        self.on_pause = on_pause
        """Answers calls that need a human, in place (the entity waits for it)."""
        self.entity_id = entity_id or new_entity_id()
        self.restart = restart
        self.on_event = on_event
        self.incarnations = 0
        self.entity: Entity | None = None
        """The current incarnation, once it runs."""
        self.ready = trio.Event()
        """Set once the first incarnation exists (summoned or resumed)."""
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)

    def child_spec(self) -> ChildSpec:
        return ChildSpec(self.entity_id, self.main, self.restart)

    async def ask(self, intent: str) -> CastResult:
        """Send one intent and wait for its cast; the entity's failure is raised here."""
        reply_send, reply_receive = trio.open_memory_channel[CastResult | BaseException](1)
        await self._send.send(_Request(intent, reply_send))
        outcome = await reply_receive.receive()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def cancel(self, reason: str = "cancelled", *, next_cast: bool = False) -> bool:
        """Cancel the cast running now, if any (recorded with ``reason``); returns
        whether one was running. With ``next_cast``, a cancel that finds none
        running applies to the next cast (see :meth:`Entity.cancel`)."""
        if self.entity is None:
            return False
        return self.entity.cancel(reason, next_cast=next_cast)

    def close(self) -> None:
        """No more intents: the entity finishes the queued ones and ends normally."""
        self._send.close()

    async def main(self, supervisor: Supervisor) -> None:
        self.incarnations += 1
        # A served entity waits in place at a pause: its front end answers it
        # (on_pause, or Entity.answer from another request).
        if self.entity_id in self.spell.loom.entities:
            entity = self.spell.resume(
                self.entity_id, on_event=self.on_event, on_pause=self.on_pause, pause="wait"
            )
        else:
            entity = self.spell.summon(
                entity_id=self.entity_id,
                on_event=self.on_event,
                on_pause=self.on_pause,
                pause="wait",
            )
        self.entity = entity
        self.ready.set()
        async with entity:
            async for request in self._receive:
                try:
                    outcome = await entity.send(request.intent)
                except CantripError as exc:
                    # An expected failure (no intent, an LLM that gave up): recorded in
                    # the loom, reported to the caller, and the entity serves on (D-011).
                    request.reply.send_nowait(exc)
                    continue
                except BaseException as exc:
                    request.reply.send_nowait(exc)  # the caller learns; the supervisor decides
                    raise
                request.reply.send_nowait(outcome)
