"""Execution: one claimed cast run to its end -- begun, resumed, or carried on.

Where the loom says an entity stands decides how its work runs: a new entity is
summoned and cast; one an earlier worker held is resumed from its recorded turns (or
found already ended, its end recorded now); a human's answer is carried out from
wherever it got to; a rollback first rewinds. A cast that fails on its own fails alone
with its error recorded; a lost lease or connection, or a cast suspended at a turn
boundary, is no failure and goes on up for another claim to resume. A suspect the
queue hands out quarantined is watched here until it records a turn.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._client_gates import CLIENT_TOOLS_KEY, client_gates
from cantrip._core import Entity
from cantrip._core._budget import history_account
from cantrip._core._cast_context import close_cast_context
from cantrip._errors import CantripError, LLMError
from cantrip._gate import Gate
from cantrip._outcome import CastResult, recorded_cast
from cantrip._redact import get_logger
from cantrip.distributed._followups import QueuedFollowups, consolidation_spell
from cantrip.distributed._outage import database_away, describe, is_connection_error
from cantrip.distributed._outcome import (
    failure_outcome,
    lease_lost,
    outcome_of,
    state_of,
    suspended,
)
from cantrip.distributed._owned import Look, Owned
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import build_spell, spell_key
from cantrip.distributed._work import (
    ANSWER_KEY,
    BUDGETS_KEY,
    CONSOLIDATES_KEY,
    CWD_KEY,
    CWD_TAG,
    REWIND_KEY,
    USER_KEY,
    Claim,
)
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.memory._consolidate import CONSOLIDATES_TAG
from cantrip.memory._settings import USER_TAG

log = get_logger("cantrip.worker")

QUARANTINE_TICK_S = 0.05
"""How often a worker running a suspect alone looks whether it recorded a turn (its
entity's leaf, in memory): the worker claims nothing else until then."""


class Execution:
    """Runs claimed casts against one loom, building each spell once (cached by
    :func:`~cantrip.distributed._spells.spell_key`)."""

    def __init__(
        self,
        loom: Loom,
        queue: WorkQueue | None = None,
        mail: Callable[[int], list[tuple[int, str]]] | None = None,
    ) -> None:
        self.loom = loom
        self.queue = queue
        """Where the casts' followups (consolidations) are queued (None: run here)."""
        self.spells: dict[str, Cantrip] = {}
        self.mail = mail
        """Reads the messages sent to a work item (``WorkQueue.messages``): in the same
        thread hop as the entity's refresh, so the mailbox's first read costs no hop
        of its own (issue 46.4)."""

    def look(self, claim: Claim) -> Look:
        """What the cast of ``claim`` needs from the database before it begins (blocking:
        in a thread): the messages sent to its work so far -- read before the refresh, so
        a message the cast's turns took is read in the loom after it -- and its entity's
        record and latest turn, read into the loom's cache."""
        first_mail = self.mail(claim.work_id) if self.mail is not None else None
        record, last = self.loom.refresh(claim.entity_id)
        return first_mail, record, last

    def look_many(self, claims: list[Claim]) -> list[Look | None]:
        """:meth:`look` for casts claimed together, in one thread hop (issue 46.4: a hop
        costs both threads ~60 us of CPU). One that failed is None: its cast looks
        again itself, where its error counts as it always did (this is no boundary of
        its own, only a head start)."""
        looks: list[Look | None] = []
        for claim in claims:
            try:
                looks.append(self.look(claim))
            except Exception:  # noqa: BLE001 -- the cast's own look raises it again
                looks.append(None)
        return looks

    def asks_humans(self, owned: Owned) -> bool:
        """Whether the claimed spell's circle can pause (only then are live pauses watched)."""
        claim = owned.claim
        spell = self.spells.get(_key(owned))
        return CLIENT_TOOLS_KEY in claim.spell or spell is None or spell.circle.needs_humans

    async def execute(self, owned: Owned) -> tuple[str, dict[str, Any]]:
        """The work's end state and outcome. A cast that cannot run -- its spell does not
        build here, its LLM failed for good, an error of its own -- fails alone with the
        error recorded (redacted): the worker and its other casts go on. A lost lease or
        connection is not the cast's failure, nor is a cast suspended between turns (the
        worker is stopping): it propagates, and another claim resumes."""
        claim = owned.claim
        try:
            return await self._attempt(owned)
        except Exception as exc:
            if is_connection_error(exc) or lease_lost(exc) or suspended(exc):
                raise
            if isinstance(exc, CantripError):
                log.warning("%s: the cast failed: %s", claim.entity_id, describe(exc))
            else:  # a bug: its traceback is for the log, the cast fails alone
                log.exception("%s: the cast failed on an error in cantrip", claim.entity_id)
            return "failed", failure_outcome(claim.entity_id, exc)

    async def _attempt(self, owned: Owned) -> tuple[str, dict[str, Any]]:
        claim = owned.claim
        answer = claim.spell.get(ANSWER_KEY)  # work that carries out a human's answer
        rewind = claim.spell.get(REWIND_KEY)  # a rollback: continue from this turn
        offered = client_gates(claim.spell.get(CLIENT_TOOLS_KEY) or ())  # a front end's tools
        user = claim.spell.get(USER_KEY)  # the session's user: the cast's ``user`` tag
        tags: dict[str, Any] | None = {USER_TAG: user} if isinstance(user, str) else None
        cwd = claim.spell.get(CWD_KEY)  # where the session was created: its ``cwd`` tag
        if isinstance(cwd, str):
            tags = {**(tags or {}), CWD_TAG: cwd}
        key = _key(owned)
        spell = self.spells.get(key)
        if spell is None:
            spell = self.spells[key] = build_spell(json.loads(key), self.loom)
        consolidates = claim.spell.get(CONSOLIDATES_KEY)  # a consolidation: its own cantrip
        if consolidates is not None:
            spell = await consolidation_spell(spell)
            tags = {**(tags or {}), CONSOLIDATES_TAG: consolidates}
        if owned.looking is not None:  # looked up with the casts claimed beside it
            await owned.looking.wait()
        looked, owned.looked = owned.looked, None
        if looked is None:
            fresh: Look = await trio.to_thread.run_sync(
                self.look,
                claim,
                limiter=self.loom.store.limiter,  # type: ignore[attr-defined]
            )
            looked = fresh
        first_mail, record, last = looked
        if first_mail is not None:
            owned.first_mail = first_mail
        entity: Entity
        try:
            if answer is not None:
                if record is None:
                    raise CantripError(f"no entity {claim.entity_id} in the loom to answer")
                entity = owned.entity = _offering(
                    spell.resume(claim.entity_id, pause="leave"), offered
                )
                _queueing(entity, self.queue, claim.spell)
                recorded = self._recorded(claim, last)
                ended = await self._ended(entity, claim, recorded)
                if ended is not None:
                    return ended
                await self._spending(owned, recorded)
                self._casting(owned, recorded)
                result = await self._cast(owned, self._answered(entity, claim, answer, last))
                return state_of(result), outcome_of(result)
            if record is None:
                entity = owned.entity = _offering(
                    spell.summon(entity_id=claim.entity_id, pause="leave"), offered
                )
                _queueing(entity, self.queue, claim.spell)
                if owned.cancelled:
                    entity.cancel(owned.cancel_reason)
                await self._spending(owned, [])
                self._casting(owned, [])
                result = await self._cast(owned, entity.send(claim.intent, tags=tags))
            else:
                entity = owned.entity = _offering(
                    spell.resume(claim.entity_id, pause="leave"), offered
                )
                _queueing(entity, self.queue, claim.spell)
                recorded = self._recorded(claim, last, rewind)
                ended = await self._ended(entity, claim, recorded)
                if ended is not None:
                    return ended
                if rewind is not None and not recorded:  # (again, if a worker died since)
                    await entity.rewind(rewind.get("to"))
                await self._spending(owned, recorded)
                self._casting(owned, recorded)
                if recorded or claim.resumed:
                    # an earlier attempt may have journaled the turn it was taking
                    result = await self._cast(owned, entity.resume_cast(claim.intent, recorded))
                else:
                    result = await self._cast(owned, entity.send(claim.intent, tags=tags))
        except (LLMError, PauseError) as exc:
            return "failed", failure_outcome(claim.entity_id, exc)
        return state_of(result), outcome_of(result)

    async def _spending(self, owned: Owned, recorded: list[Turn]) -> None:
        """Under ``serve --db --session-budget``, the session's account above the cast:
        what its entity and their children spent before, read from the loom (not the
        ``recorded`` turns of the cast being continued: it charges those itself)."""
        limits = owned.claim.spell.get(BUDGETS_KEY)
        entity = owned.entity
        if not limits or entity is None:
            return
        entity.spends_under = await trio.to_thread.run_sync(
            functools.partial(history_account, self.loom, entity.id, limits, besides=recorded),
            limiter=self.loom.store.limiter,  # type: ignore[attr-defined]
        )

    @staticmethod
    def _casting(owned: Owned, recorded: list[Turn]) -> None:
        """The cast is about to begin: messages may be handed to it from now on, but not
        those its recorded turns (an earlier attempt's) already took."""
        owned.delivered = sum(len(t.extras.get("steering") or ()) for t in recorded)
        owned.began = owned.entity.leaf if owned.entity is not None else None
        owned.casting.set()

    async def _ended(
        self, entity: Entity, claim: Claim, recorded: list[Turn]
    ) -> tuple[str, dict[str, Any]] | None:
        """How the work ended if an earlier attempt's worker died after the loom said so:
        the cast's last turn ended it, or it is a pause (it waits for an answer). What
        the ended cast leaves behind is handed on again (its consolidation, queued once
        whichever attempt gets there: the dead worker may not have)."""
        if not recorded:
            return None
        end = recorded[-1]
        if not (end.terminated or end.truncated or isinstance(end.extras.get("pending"), Mapping)):
            return None
        result = recorded_cast(recorded, 0, self.loom)
        if self.queue is not None and CONSOLIDATES_KEY not in claim.spell:
            await close_cast_context(entity, {}, result, continued=True)
        return state_of(result), outcome_of(result)

    def _answered(
        self, entity: Entity, claim: Claim, answer: Mapping[str, Any], last: Turn | None
    ) -> Any:
        """The cast that carries out a human's answer, from wherever the loom says it is:
        not begun (answer it), recorded but not carried out to the end of its turn (carry
        out the recorded answer through the journal), or further (resume the cast)."""
        pause_id = str(answer["pause_id"])
        decision = Decision.parse(answer["decision"])
        recorded = self._recorded(claim, last)
        if not recorded:
            return entity.answer(pause_id, decision)
        found = entity.recorded_answer()
        if found is not None and found[0].pause_id == pause_id:
            return entity.carry_out_recorded_answer()
        return entity.resume_cast(claim.intent, recorded)

    async def _cast(self, owned: Owned, running: Any) -> CastResult:
        entity = owned.entity
        assert entity is not None
        if owned.handing_back:  # the worker is stopping: no turn of it begins
            entity.suspend()
        try:
            if owned.cancelled:
                # cancelled before it started: the cast records that and ends at once
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_soon, entity, owned.cancel_reason)
                    result: CastResult = await running
                return result
            result = await running
            return result
        finally:
            with trio.CancelScope(shield=True):
                await entity.aclose()

    def _recorded(
        self, claim: Claim, last: Turn | None, rewind: Mapping[str, Any] | None = None
    ) -> list[Turn]:
        """The turns of this work's cast already in the loom (an earlier attempt's). A
        rollback's cast continues from its rewind point, not from the base turn (the end
        of the cast it cut off, on the branch it left)."""
        if last is None or last.id == claim.base_turn:
            return []
        turns = [t for t in self.loom.lineage(last.id) if t.entity_id == claim.entity_id]
        start = claim.base_turn if rewind is None else rewind.get("to")
        if start is not None:
            ids = [t.id for t in turns]
            if start in ids:
                turns = turns[ids.index(start) + 1 :]
        return turns


def _offering(entity: Entity, gates: tuple[Gate, ...]) -> Entity:
    """The entity, offered the gates its work's front end runs itself (if any)."""
    if gates:
        entity.offer(gates)
    return entity


def _queueing(entity: Entity, queue: WorkQueue | None, spell: Mapping[str, Any]) -> Entity:
    """The entity, the work its casts leave behind (consolidation) queued for the
    workers rather than run here (a consolidation's own leaves none)."""
    if queue is not None and CONSOLIDATES_KEY not in spell:
        entity.followups = QueuedFollowups(queue, spell)
    return entity


async def _cancel_soon(entity: Entity, reason: str) -> None:
    while not entity.cancel(reason):
        await trio.sleep(0)


async def watch_quarantine(
    owned: Owned, queue: WorkQueue, limiter: trio.CapacityLimiter, poll_s: float
) -> bool:
    """A suspect cast runs here alone: once it records a turn -- it got past where
    the worker that held it died, without killing this one -- it is innocent again
    (recorded in the queue first, so a crash from now on is not blamed on it alone),
    and the worker takes other work beside it (True: cleared; False: the lease
    is lost, the run is stopping)."""
    await owned.casting.wait()
    entity = owned.entity
    assert entity is not None
    while entity.leaf in (owned.began, None):
        await trio.sleep(QUARANTINE_TICK_S)
    clear = functools.partial(queue.cleared, owned.claim)
    while True:
        with database_away() as away:
            cleared = await trio.to_thread.run_sync(clear, limiter=limiter)
        if away.exc is None:
            break
        await trio.sleep(poll_s)  # still alone meanwhile: try again
    if cleared:  # (else the lease is lost: the run is stopping)
        log.info("%s: recorded a turn in quarantine; innocent again", owned.claim.entity_id)
    return bool(cleared)


def _key(owned: Owned) -> str:
    """The cast's :func:`~cantrip.distributed._spells.spell_key`, made once per cast (the
    worker asks for it before the cast and again as it begins)."""
    if owned.spell_key is None:
        owned.spell_key = spell_key(owned.claim.spell)
    return owned.spell_key
