"""The entity: a cantrip's loop, running (1.4) -- the face over the core's parts.

An entity is produced only by :meth:`Cantrip.summon` (and ``cast``, which is
summon + one intent + close; ENTITY-1), :meth:`Cantrip.resume`,
:meth:`Cantrip.fork` and a delegation gate spawning a child; each uses the
named constructor that fits (:meth:`Entity.fresh`, :meth:`Entity.resumed`,
:meth:`Entity.forked`). Each :meth:`Entity.send` is one cast.

This class holds the entity's state (:class:`._state.EntityState`) and its
parts, and says what each public method means; the work is the parts':
the turn loop (:mod:`._loop`), a turn's ending (:mod:`._conclude`), turn
recording (:mod:`._recording`), the cast's state (:mod:`._cast`), pauses
(:mod:`._pauses`), the gate host (:mod:`._host`), steering (:mod:`._steering`)
and the cost ward (:mod:`cantrip._wards`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs

from cantrip._approval import Decision, Pause, PauseError
from cantrip._context import Context
from cantrip._core._budget import Account, TreeBudget, recorded_tree, tree_budget
from cantrip._core._cast import Cast, UsageTally
from cantrip._core._cast_context import (
    close_cast_context,
    open_cast_context,
    reopen_cast_context,
)
from cantrip._core._followups import Followups
from cantrip._core._loop import cancel_reason, continue_paused, run_cast
from cantrip._core._pauses import PauseBoard, PauseHandler, PauseMode, Pauses
from cantrip._core._recording import checkpoint, now
from cantrip._core._state import EntityState, Spell
from cantrip._core._steering import Steering
from cantrip._cost import CostMeter
from cantrip._errors import CantripError, ConstructionError, LoomError
from cantrip._events import EventSink
from cantrip._gate import Gate
from cantrip._outcome import CastResult
from cantrip._providers import ProviderScope
from cantrip._replay import fork_strategy
from cantrip._running import CURRENT_ENTITY as RUNNING
from cantrip._text import require_intent
from cantrip._wards import cost_meter
from cantrip.llm._contract import LLM, Usage
from cantrip.loom._model import EntityRecord, Turn, new_entity_id

CURRENT_ENTITY = cast("contextvars.ContextVar[Entity]", RUNNING)
"""The entity on whose behalf a gate is running (for delegation gates): the variable
of :mod:`cantrip._running`, which mediums read as a ``RunningEntity``, typed here as the
entity it always holds (only entities set it)."""


class Entity(EntityState):
    """A running (or resting, between casts) instance of a cantrip."""

    _pauses: Pauses
    """Its pauses: the board it shares with its tree, and how it meets a pause."""

    # -- construction -----------------------------------------------------------

    def __init__(
        self,
        cantrip: Spell,
        *,
        llm: LLM,
        entity_id: str | None = None,
        parent_entity_id: str | None = None,
        spawned_from: str | None = None,
        depth: int = 0,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: PauseMode = "return",
    ) -> None:
        """What every entity starts with; use a named constructor (:meth:`fresh`,
        :meth:`resumed`, :meth:`forked`), which also records or reads the entity
        in the loom."""
        self.id = entity_id or new_entity_id()
        self.parent_entity_id = parent_entity_id
        self.depth = depth
        self.on_event = on_event
        self._inflight = None
        self._cast = None
        self._scope = None
        self._cancel_requested = False
        spawner = CURRENT_ENTITY.get(None)
        child = spawner is not None and parent_entity_id == spawner.id
        if spawner is not None and child:
            # A child waits in place and is answered through its root (one board).
            self._pauses = Pauses(spawner._pauses.board, "wait")
        else:
            self._pauses = Pauses(PauseBoard(handler=on_pause), pause)
        self.questions_in_calls = getattr(spawner, "questions_in_calls", True) if child else True
        self._cancel_reason = "cancelled"
        self._cancel_next = None
        self._suspend = False
        self.cantrip = cantrip
        self.llm = llm
        self.loom = cantrip.loom
        self.circle = cantrip.circle
        self._usage = UsageTally()
        setup = self._setup = cantrip.setup_for(llm)
        self._context = Context(setup.system, self.circle.medium, setup.folding)
        self._restore = ()
        self.restore_report = None
        self._leaf = spawned_from
        self._sequence = 0
        self._session = None
        self._steering = Steering()
        self._closed = False
        self._continuing = False
        self.provider_nursery = None
        self.followups = None
        self._own_followups: Followups | None = None
        self.spends_under = None
        self._providers = None
        self._provided = False
        self._offered = ()

    @classmethod
    def fresh(
        cls,
        cantrip: Spell,
        *,
        llm: LLM,
        entity_id: str | None = None,
        parent_entity_id: str | None = None,
        spawned_from: str | None = None,
        depth: int = 0,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: PauseMode = "return",
    ) -> Entity:
        """A new entity, recorded in the loom (a child: spawned from ``spawned_from``,
        a checkpoint of its parent's turn)."""
        entity = cls(
            cantrip,
            llm=llm,
            entity_id=entity_id,
            parent_entity_id=parent_entity_id,
            spawned_from=spawned_from,
            depth=depth,
            on_event=on_event,
            on_pause=on_pause,
            pause=pause,
        )
        entity._register(spawned_from=spawned_from)
        return entity

    @classmethod
    def resumed(
        cls,
        cantrip: Spell,
        entity_id: str,
        *,
        llm: LLM,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: PauseMode = "return",
    ) -> Entity:
        """A restarted incarnation of ``entity_id``: its state comes from the loom,
        not from memory (its context now, its sandbox when it first runs)."""
        entity = cls(
            cantrip, llm=llm, entity_id=entity_id, on_event=on_event, on_pause=on_pause, pause=pause
        )
        record = entity.loom.entity(entity.id)
        entity.parent_entity_id = record.parent_entity_id
        last = entity.loom.last_turn(entity.id)
        if last is not None:
            entity._go_on_from(last)
        return entity

    @classmethod
    def forked(
        cls,
        cantrip: Spell,
        fork_point: Turn,
        *,
        llm: LLM,
        entity_id: str | None = None,
        on_event: EventSink | None = None,
    ) -> Entity:
        """A new entity continuing from ``fork_point``, by replay (LOOM-4/13): the
        context is rebuilt from the recorded thread, the sandbox when it opens
        (cantrip._replay); gate results come from the loom and no gate runs again."""
        entity = cls(cantrip, llm=llm, entity_id=entity_id, on_event=on_event)
        if fork_point.extras.get("phase") in ("checkpoint", "continuation+checkpoint"):
            raise LoomError(
                f"turn {fork_point.id} is a delegation checkpoint, the middle of an "
                "utterance; fork from the turn that completes it"
            )
        entity._go_on_from(fork_point)
        entity._register(forked_from=fork_point)
        return entity

    def _go_on_from(self, turn: Turn) -> None:
        """Make ``turn`` this entity's leaf, its thread replayed into the context
        (and, when the sandbox opens, into the sandbox)."""
        self._restore = self.loom.lineage(turn.id)
        self._context.replay(self._restore)
        self._leaf = turn.id
        self._sequence = turn.sequence

    def _register(
        self, *, spawned_from: str | None = None, forked_from: Turn | None = None
    ) -> None:
        self.loom.register_entity(
            EntityRecord(
                entity_id=self.id,
                cantrip_id=self.cantrip.id,
                identity=self._setup.identity,
                medium=self.circle.medium.name,
                llm=self._setup.llm_name,
                parent_entity_id=self.parent_entity_id,
                spawned_from=spawned_from,
                created_at=now(),
                forked_from=forked_from.id if forked_from is not None else None,
                fork_strategy=fork_strategy(self.circle.medium) if forked_from else None,
            )
        )

    # -- lifecycle -------------------------------------------------------------

    @property
    def turns(self) -> Sequence[Turn]:
        return self.loom.entity_turns(self.id)

    @property
    def pause_mode(self) -> PauseMode:
        """How a cast meets a pause: ``"return"``, ``"wait"`` or ``"leave"`` (see
        :class:`cantrip._core._pauses.Pauses`). Children always wait in place."""
        return self._pauses.mode

    @pause_mode.setter
    def pause_mode(self, mode: PauseMode) -> None:
        self._pauses.mode = mode

    async def aclose(self) -> None:
        """End the entity: its medium state and gate providers are released; its
        record endures (ENTITY-4). The work its casts left in its own nursery
        (memory consolidation) is waited for."""
        self._closed = True
        try:
            if self._session is not None:
                session, self._session = self._session, None
                await session.aclose()
        finally:
            try:
                if self._providers is not None:
                    providers, self._providers = self._providers, None
                    await providers.aclose()
            finally:
                if self._own_followups is not None:
                    own, self._own_followups = self._own_followups, None
                    if self.followups is own:
                        self.followups = None
                    await own.aclose()

    async def __aenter__(self) -> Entity:
        if self.cantrip.circle.providers and self._providers is None:
            # The entity's nursery: its gate providers (MCP sessions) live here,
            # across every cast until the entity is closed.
            self._providers = await ProviderScope.enter()
        context = self.cantrip.cast_context
        if context is not None and context.follows_up and self.followups is None:
            # What its casts leave behind (consolidation) runs here, until it closes.
            self._own_followups = self.followups = await Followups.enter()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- casts -----------------------------------------------------------------

    async def send(
        self, intent: str | None, *, tags: Mapping[str, Any] | None = None
    ) -> CastResult:
        """One cast on this entity: run ``intent`` until done or a ward (ENTITY-5).

        ``tags`` are recorded in the extras of the cast's first turn, so what a
        front end knows about the request (an idempotency key) is in the loom.

        Wards: ``max_turns`` is checked after each turn; the tree budgets
        (``max_tokens_total``, ``max_cost_usd``, ``max_gate_calls``, ``max_children``)
        before each model call, gate call and child, counting the casts this one
        spawns (cantrip._core._budget); ``timeout_s`` cuts the cast off wherever it
        is. Cancellation from outside (a parent ending, an API call) is recorded as a
        truncated turn -- with the in-flight gate calls completed as ``cancelled`` --
        and then re-raised.
        """
        intent = require_intent(intent)
        cast = Cast(intent, self._meter(), tags=dict(tags or {}), budget=self._budget())
        await open_cast_context(self, cast)
        result = await run_cast(self, self._pauses, cast, fresh=True)
        await close_cast_context(self, cast.tags, result)
        return result

    async def resume_cast(self, intent: str, recorded: Sequence[Turn]) -> CastResult:
        """Continue a cast that an earlier incarnation of this entity began and never
        finished (its worker died): ``recorded`` are the cast's turns already in the
        loom -- they count toward the wards -- and the turn that was in flight
        continues from the gate journal (its utterance and recorded gate results are
        reused; see cantrip._journal). The intent is already in the context."""
        intent = require_intent(intent)
        cast = Cast(intent, self._meter(), budget=self._budget())
        cast.add_recorded(recorded)
        if not recorded:  # nothing of it reached the loom: it opens as a sent cast does
            await open_cast_context(self, cast)
        else:  # its gates work where its first turn said (memory's namespace, source)
            await reopen_cast_context(self, recorded)
        if recorded and (cast.budget.bounded or cast.meter.bounded):
            # the tree's account survives the handoff: what the children spawned
            # before it spent is in the loom
            cast.add_spawned(*recorded_tree(self.loom, self.id, recorded))
        self._continuing = True
        result = await run_cast(self, self._pauses, cast, fresh=not recorded)
        await close_cast_context(self, cast.tags, result)
        return result

    def _meter(self) -> CostMeter:
        """This cast's cost meter, charging the cast that spawned it (if any), else
        the account its host opened above it (:attr:`spends_under`)."""
        above = self._above()
        return cost_meter(self.circle.resolved, above.meter if above is not None else None)

    def _budget(self) -> TreeBudget:
        """This cast's tree account, charging the same as :meth:`_meter`."""
        above = self._above()
        return tree_budget(self.circle.resolved, above.budget if above is not None else None)

    def _above(self) -> Cast | Account | None:
        parent = CURRENT_ENTITY.get(None)
        parent_cast = parent._cast if parent is not None and parent is not self else None
        return parent_cast if parent_cast is not None else self.spends_under

    def steer(self, text: str) -> bool:
        """Send a message to the running cast: it joins the cast's next turn, as a
        user message recorded in that turn (``extras["steering"]``), so the thread,
        exports and the viewer show it where the model saw it. A code medium's
        entity receives it between turns, never inside running code. Returns
        whether a cast was running to take it; one that ends before another turn
        reports the message in :attr:`CastResult.undelivered`."""
        return self._steering.send(text, running=self._cast is not None)

    async def rewind(self, turn_id: str | None) -> None:
        """Continue this entity's thread from ``turn_id`` (a turn of its own thread, or
        ``None`` for its beginning) instead of its latest turn. The turns after it stay
        in the loom, as a branch no longer in the thread (double-texting's
        ``rollback``); the sandbox and the context are rebuilt from the loom, as for a
        resumed entity. Sequence numbers keep increasing."""
        if self._cast is not None:
            raise CantripError("cannot rewind an entity while a cast runs")
        if turn_id is not None and self.loom.get(turn_id).entity_id != self.id:
            raise LoomError(f"turn {turn_id} is not a turn of entity {self.id}")
        if self._session is not None:
            session, self._session = self._session, None
            await session.aclose()
        lineage = self.loom.lineage(turn_id) if turn_id is not None else ()
        setup = self._setup
        self._context = Context(setup.system, self.circle.medium, setup.folding)
        self._context.replay(lineage)
        self._restore = lineage
        self._leaf = turn_id

    def offer(self, gates: Sequence[Gate]) -> None:
        """Offer ``gates`` to this entity's casts from now on, besides its circle's,
        in place of any offered before -- the tools an AG-UI client runs itself, sent
        with each run. Between casts only; a name the circle already has is refused."""
        if not gates and not self._offered:
            return  # nothing offered, nothing to offer: the circle stays as it is
        if self._cast is not None:
            raise CantripError("cannot change the offered gates while a cast runs")
        before = {g.name for g in self._offered}
        kept = tuple(g for g in self.circle.gates if g.name not in before)
        taken = sorted({g.name for g in kept} & {g.name for g in gates})
        if taken:
            raise ConstructionError(f"the circle already has a gate named {', '.join(taken)}")
        self._offered = tuple(gates)
        self.circle = attrs.evolve(self.circle, gates=(*kept, *self._offered))
        self._setup = attrs.evolve(self._setup, tools=self.circle.tools())

    @property
    def usage(self) -> Usage:
        """Tokens this entity's recorded turns used, over all its casts."""
        return self._usage.usage

    def cancel(self, reason: str = "cancelled", *, next_cast: bool = False) -> bool:
        """Cancel the running cast, if any (COMP-9): it ends as truncated with reason
        ``reason`` (``cancelled``, or e.g. ``shutdown``; its children as
        ``parent_terminated``); the entity stays usable for the next intent.
        Returns whether a cast was running.

        With ``next_cast``, a cancel that finds no cast running applies to the
        next one instead (a sticky cancel): it is recorded as cut off with
        ``reason`` before its first LLM call."""
        if self._scope is None:
            if next_cast:
                self._cancel_next = reason
            return False
        self._cancel_requested, self._cancel_reason = True, reason
        self._scope.cancel()
        return True

    def suspend(self) -> None:
        """Stop the running cast -- or the next one, if none runs -- at its next turn
        boundary, recording nothing more: there, with every turn before it durable,
        the cast raises :class:`CastSuspended`, and the loom reads as if its process
        had died between two turns (``resume_cast`` continues it, anywhere). A worker
        handing its casts back at shutdown uses it: no turn is cut off, none is run
        twice. Children are not stopped apart: a turn that spawns them is one turn."""
        self._suspend = True

    def uncancel(self) -> bool:
        """Withdraw a sticky cancel that no cast has taken yet; whether there was one."""
        pending, self._cancel_next = self._cancel_next, None
        return pending is not None

    @property
    def cancel_reason(self) -> str:
        """How a cancellation from outside is recorded (COMP-9)."""
        return cancel_reason(self)

    def checkpoint(self, *, marks: Mapping[str, Any] | None = None) -> str:
        """Commit the turn in flight up to this moment; return its id.

        Called by delegation gates before a child starts (LOOM-1 + COMP-5):
        the child's root turn points at the checkpoint, and the rest of the
        utterance is recorded later as a continuation turn whose parent is the
        checkpoint. Gate calls completed since the previous checkpoint of the
        same utterance get a checkpoint of their own, so nothing that happened
        before a child started is recorded after it.

        ``marks`` (a pause's ``pending`` marker, an ``answered`` record) always
        make a checkpoint of their own: they are facts the loom must hold.
        """
        return checkpoint(self, marks)

    # -- pauses: humans in the loop (cantrip._approval, ._pauses) ---------------------

    @property
    def pending(self) -> tuple[Pause, ...]:
        """Calls of this entity (and, while it runs, its children) waiting for a human:
        those a live task waits on, else the one the loom holds at this entity's
        leaf -- after a restart, or a cast that returned ``paused``."""
        return self._pauses.pending(self)

    @property
    def live_pending(self) -> tuple[Pause, ...]:
        """The calls a live task of this entity tree waits on in place (a child's, or
        code's in ``"wait"`` mode): answered by :meth:`answer`, the cast goes on."""
        return self._pauses.live()

    def answer_pauses_with(self, handler: PauseHandler) -> None:
        """Let ``handler`` answer this entity's pauses in place (a front end that can
        ask its human, e.g. ACP's ``session/request_permission``)."""
        self._pauses.answer_with(handler)

    async def answer(
        self, pause_id: str, decision: Decision | Mapping[str, Any]
    ) -> CastResult | None:
        """Answer a pending pause (approve / deny / edit, or the text of an answer).

        A pause a live task waits on is handed its decision and ``None`` is
        returned (the waiting cast goes on). A pause only the loom holds (after a
        restart, or a cast that returned ``paused``) is continued here: the same
        turn goes on from the call that paused, and the cast's result is returned.
        A second answer to the same pause raises :class:`~cantrip.PauseError`.
        """
        decision = Decision.parse(decision)
        if self._pauses.answer_live(pause_id, decision):
            return None
        stored = self._pauses.answerable(self, pause_id, decision)
        result = await continue_paused(
            self, self._pauses, self._meter(), stored, decision, budget=self._budget()
        )
        await close_cast_context(self, {}, result, continued=True)
        return result

    def recorded_answer(self) -> tuple[Pause, Decision] | None:
        """The answer at this entity's leaf that was recorded but never carried out
        to the end of its turn -- the process (a worker) died after recording it --
        with the pause it answered; None if the leaf is not such an answer."""
        return self._pauses.recorded_answer(self)

    async def carry_out_recorded_answer(self) -> CastResult:
        """Carry out the answer :meth:`recorded_answer` found, once: it is not
        recorded again, and the gate journal of the answer's turn is read, so a gate
        call whose result was journaled is reused, never run a second time (one
        started but not finished is "outcome unknown" unless the gate is idempotent)."""
        found = self.recorded_answer()
        if found is None:
            raise PauseError(f"entity {self.id} has no recorded answer to carry out")
        pause, decision = found
        assert self._leaf is not None
        answered = self.loom.get(self._leaf)
        result = await continue_paused(
            self, self._pauses, self._meter(), pause, decision, answered=answered,
            budget=self._budget(),
        )  # fmt: skip
        await close_cast_context(self, {}, result, continued=True)
        return result

    async def ask_during_call(
        self,
        gate: str,
        question: str,
        *,
        origin: str,
        schema: Mapping[str, Any] | None = None,
        url: str | None = None,
    ) -> Decision:
        """A question asked from inside a running call of ``gate`` by someone other than
        the entity (``origin``: an MCP server's elicitation, :mod:`cantrip.mcp._client`).

        It is a pause like ``ask_user``'s -- recorded in the loom, listed in
        :attr:`pending`, answered by the ``on_pause`` handler, :meth:`answer` or any front
        end -- but always answered in place: the call that asks is still running, so the
        cast cannot leave here (as code that asks cannot). The answer is recorded before
        it is returned; a ``schema`` (a form) makes only answers that fill it acceptable.
        With :attr:`questions_in_calls` off, the question is declined at once."""
        return await self._pauses.ask_during_call(
            self, gate, question, origin=origin, schema=schema, url=url
        )
