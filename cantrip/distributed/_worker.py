"""Workers: processes on any number of machines that run the entities others enqueue.

``cantrip worker --db URL`` runs :class:`Worker`: it claims work from the queue
(:mod:`cantrip.distributed._queue`), holds each entity under a lease it heartbeats, and
runs the cast -- resuming it from the loom when an earlier worker died holding
it. Every loom write carries the lease's fence, so a worker that lost its lease
(paused, partitioned) can never append again: its writes are refused, it drops
the entity, and the worker that claimed it next continues from what the loom
and the gate journal hold.

Children an entity spawns run in the same worker, in the entity's nursery,
under its lease: cancelling the entity (``WorkQueue.cancel``, delivered by
``NOTIFY cantrip_cancel`` with a heartbeat poll as the fallback) cancels its
whole tree, and every cut-off turn is recorded.

:class:`Dispatcher` is the enqueueing side (``cantrip cast --db``, the Python API).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._cantrip import Cantrip
from cantrip._entity import CastResult, Entity, new_entity_id
from cantrip._errors import CantripError, LLMError
from cantrip._redact import get_logger
from cantrip.distributed._queue import (
    ANSWER_KEY,
    CANCEL_CHANNEL,
    ENDED,
    PAUSED,
    WORK_CHANNEL,
    Claim,
    LivePauses,
    WorkQueue,
)
from cantrip.llm._contract import plain_json
from cantrip.loom._fence import LeaseLostError
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._postgres import PostgresStore

log = get_logger("cantrip.worker")

LIVE_TICK_S = 0.25
"""How often a worker looks for pauses its entities' children wait on in place (in
memory; while one is published, the database is asked for its answer when NOTIFY
says so, and every ``poll_s`` in case a notification was missed)."""


def spell_from_factory(path: str) -> dict[str, Any]:
    """A spell the workers build by calling ``module:function`` (it returns a Cantrip)."""
    if ":" not in path:
        raise CantripError(f"a cantrip factory is 'module:function', not {path!r}")
    return {"factory": path}


def spell_from_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A spell the workers build from a spec file's contents (its folder anchors paths)."""
    import tomllib

    file = Path(path).resolve()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CantripError(f"cannot read spec file {path}: {exc}") from None
    data.pop("loom", None)  # the workers' loom is the database
    return {"spec": data, "base_dir": str(file.parent)}


def build_spell(spell: Mapping[str, Any], loom: Loom) -> Cantrip:
    """The cantrip a queued spell describes, recording into ``loom``."""
    if "factory" in spell:
        module, _, name = str(spell["factory"]).partition(":")
        factory = getattr(importlib.import_module(module), name)
        built = factory()
        if not isinstance(built, Cantrip):
            raise CantripError(f"{spell['factory']} returned {type(built).__name__}, not a Cantrip")
        return built.with_(loom=loom)
    from cantrip._specfile import build_cantrip, parse_spec

    doc = parse_spec(spell["spec"], source="queued spec")
    base = spell.get("base_dir")
    return build_cantrip(doc, base_dir=Path(base) if base else None, loom=loom)


def outcome_of(result: CastResult) -> dict[str, Any]:
    outcome = {
        "result": plain_json(result.result),
        "terminated": result.terminated,
        "truncated": result.truncated,
        "reason": result.reason,
        "entity_id": result.entity_id,
        "turns": len(result.turns),
        "cost_usd": result.cost_usd,  # the whole tree's, as every result reports it
    }
    if result.pending:
        outcome["pending"] = [p.to_dict() for p in result.pending]
    return outcome


def _state_of(result: CastResult) -> str:
    """The work item's end state for a cast's result (``paused``: waits for an answer)."""
    if result.reason == "cancelled":
        return "cancelled"
    return PAUSED if result.pending else "done"


@attrs.define
class _Owned:
    """An entity this worker runs now."""

    claim: Claim
    entity: Entity | None = None
    cancelled: bool = False
    releasing: bool = False
    """Set just before ``finish`` releases the lease: from then on a heartbeat that finds
    the lease gone is not a loss (finish itself reports a lease lost before it)."""
    poke: trio.Event = attrs.Factory(trio.Event)
    """Set when NOTIFY says something about this entity (an answer to a live pause)."""

    def cancel(self) -> None:
        self.cancelled = True
        if self.entity is not None:
            self.entity.cancel()


class Worker:
    """Claims and runs queued casts until cancelled (``cantrip worker``)."""

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 16,
        lease_s: float = 10.0,
        poll_s: float = 2.0,
        worker_id: str | None = None,
    ) -> None:
        self.url = url
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self._owned: dict[str, _Owned] = {}
        self._wake = trio.Event()
        self._spells: dict[str, Cantrip] = {}
        self.completed = 0

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        store = await trio.to_thread.run_sync(
            lambda: PostgresStore(self.url, max_connections=max(4, self.concurrency // 2))
        )
        self.loom = Loom(store)
        self.queue = WorkQueue(store)
        self._live = await trio.to_thread.run_sync(LivePauses, store)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._listen)
                task_status.started(self.worker_id)
                free = trio.Semaphore(self.concurrency)
                while True:
                    slots = await _take_free(free)
                    claims = await trio.to_thread.run_sync(
                        self.queue.claim_many,
                        self.worker_id,
                        self.lease_s,
                        slots,
                        limiter=store.limiter,
                    )
                    for _ in range(slots - len(claims)):
                        free.release()
                    for claim in claims:
                        nursery.start_soon(self._own, claim, free)
                    if len(claims) < slots:  # the queue is drained (for now)
                        with trio.move_on_after(self.poll_s):  # NOTIFY wakes us sooner
                            await self._wake.wait()
                        self._wake = trio.Event()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.loom.close)

    # -- wake-ups and cancels ------------------------------------------------------

    async def _listen(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """LISTEN for new work and cancel requests on a connection of its own."""
        import psycopg

        conn = await trio.to_thread.run_sync(lambda: psycopg.connect(self.url, autocommit=True))
        limiter = trio.CapacityLimiter(1)
        try:
            await trio.to_thread.run_sync(
                lambda: conn.execute(f"LISTEN {WORK_CHANNEL}; LISTEN {CANCEL_CHANNEL}"),
                limiter=limiter,
            )
            task_status.started()
            while True:
                notes = await trio.to_thread.run_sync(
                    lambda: [
                        (n.channel, n.payload) for n in conn.notifies(timeout=0.25, stop_after=1)
                    ],
                    limiter=limiter,
                )
                for channel, payload in notes:
                    if channel == WORK_CHANNEL:
                        self._wake.set()
                        if payload in self._owned:
                            self._owned[payload].poke.set()
                    elif channel == CANCEL_CHANNEL and payload in self._owned:
                        self._owned[payload].cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)

    # -- one entity --------------------------------------------------------------

    async def _own(self, claim: Claim, free: trio.Semaphore) -> None:
        owned = self._owned[claim.entity_id] = _Owned(claim)
        self.loom.hold(claim.entity_id, claim.fence)
        try:
            async with trio.open_nursery() as nursery:
                run = trio.CancelScope()
                nursery.start_soon(self._heartbeat, owned, run)
                if self._asks_humans(claim):
                    nursery.start_soon(self._live_pauses, owned)
                try:
                    with run:
                        state, outcome = await self._execute(owned)
                        owned.releasing = True
                        finished = await trio.to_thread.run_sync(
                            self.queue.finish,
                            claim,
                            state,
                            outcome,
                            limiter=self.loom.store.limiter,  # type: ignore[attr-defined]
                        )
                        if finished:
                            self.completed += 1
                        else:
                            log.warning(
                                "%s: lease lost before the outcome was recorded", claim.entity_id
                            )
                except LeaseLostError as exc:
                    log.warning("%s", exc)  # another worker continues the entity
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._owned.pop(claim.entity_id, None)
            self.loom.release(claim.entity_id)
            free.release()

    async def _heartbeat(self, owned: _Owned, run: trio.CancelScope) -> None:
        """Extend the lease every third of it; stop the entity the moment it is lost."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        while True:
            held, cancel = await trio.to_thread.run_sync(
                self.queue.heartbeat, owned.claim.fence, self.lease_s, limiter=limiter
            )
            if not held:
                if owned.releasing:  # given up on purpose by finish, not lost
                    return
                log.warning("%s: lease lost; stopping it here", owned.claim.entity_id)
                run.cancel()
                return
            if cancel and not owned.cancelled:
                owned.cancel()  # the poll fallback of NOTIFY cantrip_cancel
            await trio.sleep(self.lease_s / 3)

    def _asks_humans(self, claim: Claim) -> bool:
        """Whether the claimed spell's circle can pause (only then are live pauses watched)."""
        built = {k: v for k, v in claim.spell.items() if k != ANSWER_KEY}
        spell = self._spells.get(json.dumps(built, sort_keys=True))
        return spell is None or spell.circle.needs_humans

    async def _live_pauses(self, owned: _Owned) -> None:
        """Pauses the entity tree waits on in place -- a child's (children cannot leave
        their parent's cast) -- published so that any process can answer them
        (``Dispatcher.answer``, ``serve --db``); their answers handed to the entity."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        published: set[str] = set()
        asked_at = -math.inf
        try:
            while True:
                woken, owned.poke = owned.poke, trio.Event()  # a NOTIFY from now on wakes us
                entity = owned.entity
                live = {p.pause_id: p for p in (entity.live_pending if entity else ())}
                fresh = [p.to_dict() for i, p in live.items() if i not in published]
                if fresh:
                    await trio.to_thread.run_sync(
                        self._live.publish, owned.claim, fresh, limiter=limiter
                    )
                    published.update(p["pause_id"] for p in fresh)
                gone = {i for i in published if i not in live}  # answered by a timeout
                due = woken.is_set() or trio.current_time() - asked_at >= self.poll_s
                if entity is not None and published - gone and due:
                    asked_at = trio.current_time()
                    answers = await trio.to_thread.run_sync(
                        self._live.answers, sorted(published - gone), limiter=limiter
                    )
                    for pause_id, decision in answers:
                        gone.add(pause_id)
                        try:
                            await entity.answer(pause_id, decision)
                        except PauseError as exc:  # timed out meanwhile: it was denied
                            log.info("%s: %s", owned.claim.entity_id, exc)
                if gone:
                    await trio.to_thread.run_sync(self._live.forget, sorted(gone), limiter=limiter)
                    published.difference_update(gone)
                with trio.move_on_after(LIVE_TICK_S):
                    await owned.poke.wait()
        finally:
            if published:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        self._live.forget, sorted(published), limiter=limiter
                    )

    async def _execute(self, owned: _Owned) -> tuple[str, dict[str, Any]]:
        claim = owned.claim
        built = dict(claim.spell)
        answer = built.pop(ANSWER_KEY, None)  # work that carries out a human's answer
        key = json.dumps(built, sort_keys=True)
        spell = self._spells.get(key)
        if spell is None:
            spell = self._spells[key] = build_spell(built, self.loom)
        record, last = await trio.to_thread.run_sync(
            self.loom.refresh,
            claim.entity_id,
            limiter=self.loom.store.limiter,  # type: ignore[attr-defined]
        )
        entity: Entity
        try:
            if answer is not None:
                if record is None:
                    raise CantripError(f"no entity {claim.entity_id} in the loom to answer")
                entity = owned.entity = spell.resume(claim.entity_id, pause="leave")
                ended = self._ended(claim, self._recorded(claim, last))
                if ended is not None:
                    return ended
                result = await self._cast(owned, self._answered(entity, claim, answer, last))
                return _state_of(result), outcome_of(result)
            if record is None:
                entity = owned.entity = spell.summon(entity_id=claim.entity_id, pause="leave")
                if owned.cancelled:
                    entity.cancel()
                result = await self._cast(owned, entity.send(claim.intent))
            else:
                entity = owned.entity = spell.resume(claim.entity_id, pause="leave")
                recorded = self._recorded(claim, last)
                ended = self._ended(claim, recorded)
                if ended is not None:
                    return ended
                if recorded or claim.attempt > 1:
                    # an earlier attempt may have journaled the turn it was taking
                    result = await self._cast(owned, entity.resume_cast(claim.intent, recorded))
                else:
                    result = await self._cast(owned, entity.send(claim.intent))
        except (LLMError, PauseError) as exc:
            return "failed", {"error": f"{type(exc).__name__}: {exc}", "entity_id": claim.entity_id}
        return _state_of(result), outcome_of(result)

    @staticmethod
    def _ended(claim: Claim, recorded: list[Turn]) -> tuple[str, dict[str, Any]] | None:
        """How the work ended if an earlier attempt's worker died after the loom said so:
        the cast's last turn ended it, or it is a pause (it waits for an answer)."""
        if not recorded:
            return None
        end = recorded[-1]
        marker = end.extras.get("pending")
        if not (end.terminated or end.truncated or isinstance(marker, Mapping)):
            return None
        outcome: dict[str, Any] = {
            "result": plain_json(end.result),
            "terminated": end.terminated,
            "truncated": end.truncated,
            "reason": end.reason,
            "entity_id": claim.entity_id,
            "turns": len(recorded),
        }
        if isinstance(marker, Mapping):
            outcome["pending"] = [Pause.from_dict(marker, checkpoint_id=end.id).to_dict()]
            return PAUSED, outcome
        return ("cancelled" if end.reason == "cancelled" else "done"), outcome

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

    async def _cast(self, owned: _Owned, running: Any) -> CastResult:
        entity = owned.entity
        assert entity is not None
        try:
            if owned.cancelled:
                # cancelled before it started: the cast records that and ends at once
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_soon, entity)
                    result: CastResult = await running
                return result
            result = await running
            return result
        finally:
            with trio.CancelScope(shield=True):
                await entity.aclose()

    def _recorded(self, claim: Claim, last: Turn | None) -> list[Turn]:
        """The turns of this work's cast already in the loom (an earlier attempt's)."""
        if last is None or last.id == claim.base_turn:
            return []
        turns = [t for t in self.loom.lineage(last.id) if t.entity_id == claim.entity_id]
        if claim.base_turn is not None:
            ids = [t.id for t in turns]
            if claim.base_turn in ids:
                turns = turns[ids.index(claim.base_turn) + 1 :]
        return turns


async def _take_free(free: trio.Semaphore) -> int:
    """Wait for a free slot, then take every other slot free now too: how many a
    claim may ask for (each claimed item keeps its slot until its entity's task ends)."""
    await free.acquire()
    taken = 1
    while free.value:
        free.acquire_nowait()
        taken += 1
    return taken


async def _cancel_soon(entity: Entity) -> None:
    while not entity.cancel():
        await trio.sleep(0)


class Dispatcher:
    """Enqueue casts for the workers and wait for their outcomes (blocking calls:
    from trio, run them with ``trio.to_thread.run_sync``)."""

    def __init__(self, url: str) -> None:
        self.store = PostgresStore(url, max_connections=2)
        self.queue = WorkQueue(self.store)

    def submit(
        self, spell: Mapping[str, Any], intent: str, *, entity_id: str | None = None
    ) -> tuple[int, str]:
        """Queue ``intent`` on a new entity (or ``entity_id``); (work id, entity id)."""
        from cantrip._entity import require_intent

        require_intent(intent)
        entity_id = entity_id or new_entity_id()
        return self.queue.enqueue(dict(spell), intent, entity_id), entity_id

    def wait(self, work_id: int, *, timeout: float | None = None) -> tuple[str, dict[str, Any]]:
        """Block until the work ends (LISTEN, with polling as the fallback): done,
        failed, cancelled, or ``paused`` -- its outcome's ``pending`` lists the calls
        that wait for a human (:meth:`answer` them)."""
        import time

        import psycopg

        deadline = None if timeout is None else time.monotonic() + timeout
        with psycopg.connect(self.store.url, autocommit=True) as conn:
            conn.execute(f"LISTEN {WORK_CHANNEL}")
            while True:
                state, outcome = self.queue.status(work_id)
                if outcome is not None or state in ENDED:
                    return state, outcome or {}
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"work {work_id} still {state} after {timeout} s")
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    pass

    def cancel(self, entity_id: str) -> int:
        return self.queue.cancel(entity_id)

    def pending(self, entity_id: str) -> list[Pause]:
        """The calls ``entity_id`` waits on a human for: its work ended ``paused`` and
        nobody has answered yet (empty otherwise)."""
        return [Pause.from_dict(p) for p in self.queue.pending(entity_id)]

    def answer(self, entity_id: str, pause_id: str, decision: Decision | Mapping[str, Any]) -> int:
        """Answer a pause of a paused entity, from any process; the id of the work that
        carries the answer out (a worker resumes the entity from the loom and continues
        the cast to its end or its next pause -- :meth:`wait` for it). A pause that is
        not waiting (unknown, or answered already -- by anyone, even at the same moment)
        raises :class:`~cantrip.PauseError`; exactly one of two answers wins."""
        parsed = Decision.parse(decision)
        return self.queue.answer(entity_id, pause_id, parsed.to_dict()).work_id

    def close(self) -> None:
        self.store.close()


logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
