"""The entity: a cantrip's loop, running (1.4).

An entity is produced only by :meth:`Cantrip.summon` (and ``cast``, which is
summon + one intent + close; ENTITY-1). Each :meth:`Entity.send` is one cast:
the loop queries the LLM, lets the medium execute the utterance, records the
turn in the loom *before* the next turn begins (LOOM-1), and repeats until the
``done`` gate, a text-only answer (when ``done`` is not required) or a ward.

Failures inside the loop are observations. An LLM that cannot answer (after
the retries inside the turn) ends the cast: the turn is recorded as truncated
with reason ``llm_error`` and the :class:`~cantrip.LLMError` propagates. Any
other exception is a runtime bug and is deliberately not caught here.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import attrs
import trio
import trio.lowlevel

from cantrip._approval import Decision, Pause, PauseError, check_decision, new_pause_id
from cantrip._circle import Circle
from cantrip._context import NUDGE_DONE_REQUIRED, Context
from cantrip._cost import USAGE_UNKNOWN, CostMeter
from cantrip._errors import (
    CantripError,
    CastSuspended,
    ConstructionError,
    IntentError,
    LLMError,
    LoomError,
    ProviderError,
)
from cantrip._events import (
    Event,
    EventSink,
    FinalResponse,
    MessageComplete,
    PauseEvent,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._folding import FoldingPolicy
from cantrip._gate import Gate, GateArgumentError
from cantrip._journal import TurnJournal
from cantrip._outcome import CastResult, cast_result, cut_text
from cantrip._providers import ProviderScope
from cantrip._record_cap import capped_turn, record_cap
from cantrip._redact import get_logger
from cantrip._replay import ReplayReport, fork_strategy, restore_session
from cantrip._running import CURRENT_ENTITY as RUNNING
from cantrip._values import OBSERVATION_CAP_CHARS
from cantrip.llm._contract import (
    LLM,
    ZERO_USAGE,
    Message,
    Response,
    ToolChoice,
    ToolDefinition,
    Usage,
    can_stream,
)
from cantrip.llm._cost import (
    PriceMemo,
    llm_pricing,
    prompt_cost,
    response_cost,
    unpriced_model,
)
from cantrip.llm._retry import UNREACHABLE, RetryPolicy
from cantrip.loom._fence import LeaseLostError
from cantrip.loom._loom import Loom
from cantrip.loom._model import (
    CallStatus,
    EntityRecord,
    GateCallRecord,
    Turn,
    TurnMetadata,
)
from cantrip.medium import Execution, MediumSession, capped_execution
from cantrip.tracing._sink import with_tracing

PauseHandler = Callable[[Pause], Awaitable[Decision]]
"""A front end's way to ask its human: shows the pause, returns the decision."""

if TYPE_CHECKING:
    from cantrip._wards import WardSet

log = get_logger("cantrip.entity")

CONTINUE_CUT_OFF = (
    "Your reply was cut off by the output token limit. Continue exactly where it "
    "stopped, without repeating anything you already wrote."
)

CURRENT_ENTITY = cast("contextvars.ContextVar[Entity]", RUNNING)
"""The entity on whose behalf a gate is running (for delegation gates): the variable
of :mod:`cantrip._running`, which mediums read as a ``RunningEntity``, typed here as the
entity it always holds (only entities set it)."""


def require_intent(intent: object) -> str:
    """The intent, or :class:`IntentError` (INTENT-1)."""
    if not isinstance(intent, str) or not intent.strip():
        raise IntentError("intent is required: a cantrip cannot be cast without one (INTENT-1)")
    return intent


def new_entity_id() -> str:
    return "entity-" + os.urandom(10).hex()


class _TurnHost:
    """The circle as one turn's medium sees it, remembering every completion so a
    cut-off turn can be recorded with what had already happened."""

    __slots__ = ("circle", "emit", "gatekeeper", "journal", "records")

    def __init__(
        self,
        circle: Circle,
        emit: Callable[[Event], None] | None = None,
        journal: TurnJournal | None = None,
        gatekeeper: Gatekeeper | None = None,
    ) -> None:
        self.circle = circle
        self.emit = emit
        self.journal = journal
        """Set when the loom keeps a gate journal: calls go through it (cantrip._journal)."""
        self.gatekeeper = gatekeeper
        """Set when a call may need a human (Entity._gate_call); it runs the gate through
        :meth:`run` once the call may go ahead."""
        self.records: list[GateCallRecord] = []

    @property
    def gates(self) -> Sequence[Gate]:
        return self.circle.gates

    def gate(self, name: str) -> Gate | None:
        return self.circle.gate(name)

    def terminates(self, name: str) -> bool:
        return self.circle.terminates(name)

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord:
        if self.gatekeeper is not None:
            record = await self.gatekeeper(name, args, tool_call_id)
        else:
            record = await self.run(name, args, tool_call_id)
        self.records.append(record)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record

    async def run(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """The gate call itself, through the journal when the loom keeps one."""
        if self.journal is not None:
            return await self.journal.call(self.circle, name, args, tool_call_id)
        return await self.circle.call(name, args, tool_call_id)

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        record = self.circle.unexecuted(name, args, tool_call_id, status, message)
        self.records.append(record)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record


Gatekeeper = Callable[[str, Mapping[str, Any], "str | None"], Awaitable[GateCallRecord]]


@attrs.define(eq=False)
class _Waiter:
    pause: Pause
    event: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None


@attrs.define(eq=False)
class PauseBoard:
    """The pauses of one entity tree that a live task waits on, and who answers them.

    Shared by a root entity and every child it spawns, so an answer given to the
    root (an API call, an HTTP request, an ACP permission reply) reaches a child
    that waits inside a batch."""

    waiting: dict[str, _Waiter] = attrs.field(factory=dict)
    always: set[str] = attrs.field(factory=set)
    """Gates the human approved "always" (for this tree, in this process)."""
    handler: PauseHandler | None = None


class _PauseExit(Exception):
    """Leaves a cast at a pause (``pause="return"``): the loom holds the pause."""

    def __init__(self, pause: Pause) -> None:
        super().__init__(pause.pause_id)
        self.pause = pause


class _UsageTally:
    """Token counts summed turn by turn, as plain integers.

    Every recorded turn adds to its cast's and its entity's totals; building a
    :class:`Usage` per addition (the turn's, then the sum) cost ~4 us a turn, so
    the sum is kept as counts and made a :class:`Usage` only when read."""

    __slots__ = ("cache_write", "cached", "completion", "missing", "prompt", "reasoning")

    def __init__(self) -> None:
        self.prompt = self.completion = self.cached = self.cache_write = self.reasoning = 0
        self.missing = False

    def add(self, metadata: TurnMetadata) -> None:
        self.prompt += metadata.tokens_prompt
        self.completion += metadata.tokens_completion
        self.cached += metadata.tokens_cached
        self.cache_write += metadata.tokens_cache_write
        self.reasoning += metadata.tokens_reasoning
        self.missing = self.missing or metadata.usage_missing

    @property
    def usage(self) -> Usage:
        return Usage(
            self.prompt,
            self.completion,
            self.cached,
            self.cache_write,
            self.reasoning,
            missing=self.missing,
        )


@attrs.define
class _Inflight:
    """The turn being taken: enough to record it if it is cut off."""

    started: float
    timestamp: str
    host: _TurnHost | None = None
    """Made once the LLM has answered: nothing of a turn waits on the provider
    that does not have to (every object alive across that wait is one more for
    the garbage collector to scan when thousands of entities wait at once)."""
    response: Response | None = None
    checkpoint_id: str | None = None
    """Set once a delegation committed part of this turn (see Entity.checkpoint)."""
    recorded_upto: int = 0
    """How many of ``host.records`` the checkpoints already hold."""
    steering: tuple[str, ...] = ()
    """Messages that joined this turn (recorded with its first piece)."""


@attrs.define
class _Cast:
    """One cast's running totals."""

    intent: str
    meter: CostMeter = attrs.field(factory=CostMeter)
    """USD spent, charged up the entity tree (the cost ward)."""
    tags: Mapping[str, Any] = attrs.field(factory=dict)
    """Recorded in the extras of the cast's first turn (e.g. an idempotency key)."""
    turns: list[Turn] = attrs.field(factory=list)
    tally: _UsageTally = attrs.field(factory=_UsageTally)
    prices: PriceMemo = attrs.field(factory=dict)
    """The model prices this cast's turns were charged at (looked up once)."""
    utterances: int = 0
    """LLM answers this cast; max_turns counts these (a split turn is one)."""
    resumed: bool = False
    """A cast that goes on from a pause: its intent was recorded by the cast it continues."""
    continuations: int = 0
    """Continuations asked for this cast (bounded by the ``max_continuations`` ward)."""

    @property
    def usage(self) -> Usage:
        return self.tally.usage

    @property
    def tokens(self) -> int:
        return self.tally.prompt + self.tally.completion

    def intent_for_turn(self) -> str | None:
        """The intent is recorded on the first turn of its cast."""
        return None if self.turns or self.resumed else self.intent

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)
        metadata = turn.metadata
        if metadata.tokens_prompt or metadata.tokens_completion:
            self.tally.add(metadata)
            self.meter.charge(metadata.cost_usd)
        elif metadata.cost_usd:
            self.meter.charge(metadata.cost_usd)
        elif metadata.usage_missing:  # a call whose usage nobody knows: unknown, not $0
            self.tally.missing = True  # ... and so are the cast's tokens (``usage.missing``)
            self.meter.charge(None, why=USAGE_UNKNOWN)

    def result(self, entity_id: str, last: Turn, value: Any) -> CastResult:
        """The cast's result now that ``last`` (its latest turn) ended it; its cost is
        the whole tree's, as the meter charged it."""
        assert self.turns and self.turns[-1] is last
        return cast_result(
            self.turns, entity_id=entity_id, value=value, usage=self.usage,
            cost_usd=self.meter.total,
        )  # fmt: skip


@attrs.frozen
class EntitySetup:
    """What every entity of one cantrip and one LLM shares, worked out once.

    Summoning is on the path of every cast and every child. Recomputing these
    per entity cost more than a short cast's turns, and kept one more copy of
    each alive per entity; :meth:`Cantrip.setup_for` caches one per LLM.
    """

    query_llm: LLM
    """The LLM behind its provider stack (retries inside the turn)."""
    folding: FoldingPolicy | None
    tools: tuple[ToolDefinition, ...]
    tool_choice: ToolChoice
    extra: Mapping[str, Any]
    """Hyperparameters and provider extras, sent with every query (read-only)."""
    identity: Mapping[str, Any]
    """The identity as the loom's entity records store it (IDENTITY-4)."""
    system: Message | None
    llm_name: str | None


class Spell(Protocol):
    """What an entity reads from the cantrip that summoned it.

    The cantrip layer sits above the entity and passes itself in; the entity
    knows it only by this shape, so it never imports the layer above it.
    """

    @property
    def id(self) -> str: ...
    @property
    def loom(self) -> Loom: ...
    @property
    def circle(self) -> Circle: ...
    @property
    def retry(self) -> RetryPolicy: ...
    @property
    def llms(self) -> Mapping[str, LLM]: ...
    @property
    def folding(self) -> FoldingPolicy | None: ...
    def setup_for(self, llm: LLM) -> EntitySetup: ...
    def resolve_llm(self, llm: LLM | str | None) -> LLM: ...


class Entity:
    """A running (or resting, between casts) instance of a cantrip."""

    def __init__(
        self,
        cantrip: Spell,
        *,
        llm: LLM,
        entity_id: str | None = None,
        parent_entity_id: str | None = None,
        spawned_from: str | None = None,
        fork_point: Turn | None = None,
        depth: int = 0,
        resume: bool = False,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: Literal["return", "wait", "leave"] = "return",
    ) -> None:
        self.id = entity_id or new_entity_id()
        self.parent_entity_id = parent_entity_id
        self.depth = depth
        self.on_event = with_tracing(on_event, cantrip.loom)
        """Receives streaming events of this entity (and its children); see cantrip._events.
        With OpenTelemetry configured, a trace sink sees them too (cantrip.tracing._sink)."""
        self._inflight: _Inflight | None = None
        self._cast: _Cast | None = None
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False
        spawner = CURRENT_ENTITY.get(None)
        if spawner is not None and parent_entity_id == spawner.id:
            # A child waits in place and is answered through its root (one board).
            self._board: PauseBoard = spawner._board
            self.pause_mode: Literal["return", "wait", "leave"] = "wait"
        else:
            self._board = PauseBoard(handler=on_pause)
            self.pause_mode = pause
            """``"return"``: a cast that meets a pause returns ``paused`` (answer it to go
            on); ``"wait"``: it waits in place for :meth:`answer` or the ``on_pause``
            handler; ``"leave"`` (workers): returns ``paused`` even from inside running
            code, whose process is then let go as if it had died -- the answer continues
            from the loom (the rest of that code block does not run). Children always
            wait in place."""
        child = spawner is not None and parent_entity_id == spawner.id
        self.questions_in_calls: bool = (
            getattr(spawner, "questions_in_calls", True) if child else True
        )
        """Whether a question asked from inside a running call (an MCP server's
        elicitation, :meth:`ask_during_call`) may wait for an answer; off, it is declined
        at once -- for a host that can reach its human only between requests
        (``cantrip mcp`` answering a 2026-07-28 client without tasks), which could not
        keep the asking call alive until the answer came."""
        self._cancel_reason = "cancelled"
        self._cancel_next: str | None = None
        self._suspend = False
        """Set by :meth:`suspend`: the cast stops at its next turn boundary."""
        self.cantrip = cantrip
        self.llm = llm
        self.loom = cantrip.loom
        self.circle = cantrip.circle
        self._usage = _UsageTally()
        setup = self._setup = cantrip.setup_for(llm)
        self._context = Context(setup.system, self.circle.medium, setup.folding)
        self._restore: Sequence[Turn] = ()
        """Recorded turns to replay into the sandbox when it opens (forks, resumes)."""
        self.restore_report: ReplayReport | None = None
        self._leaf: str | None = spawned_from
        self._sequence = 0
        self._session: MediumSession | None = None
        self._steering: list[str] = []
        """Messages sent to the running cast, waiting for its next turn."""
        self._closed = False
        self._continuing = False
        """Set by :meth:`resume_cast`: the next turn may continue from the gate journal."""
        self.provider_nursery: trio.Nursery | None = None
        """A nursery a long-lived host lends to this entity's gate providers (MCP
        servers), so their sessions outlive one cast without ``async with``."""
        self._providers: ProviderScope | None = None
        self._provided = False
        self._offered: tuple[Gate, ...] = ()
        """Gates offered to this entity's casts besides its circle's (:meth:`offer`)."""
        if resume:
            # A restarted incarnation: state comes from the loom, not from memory.
            record = self.loom.entity(self.id)
            self.parent_entity_id = record.parent_entity_id
            last = self.loom.last_turn(self.id)
            if last is not None:
                self._restore = self.loom.lineage(last.id)
                self._context.replay(self._restore)
                self._leaf = last.id
                self._sequence = last.sequence
            return
        if fork_point is not None:
            # Fork by replay (LOOM-4/13): the context is rebuilt from the recorded
            # thread, the sandbox when it opens (cantrip._replay); gate results come
            # from the loom and no gate runs again.
            if fork_point.extras.get("phase") in ("checkpoint", "continuation+checkpoint"):
                raise LoomError(
                    f"turn {fork_point.id} is a delegation checkpoint, the middle of an "
                    "utterance; fork from the turn that completes it"
                )
            self._restore = self.loom.lineage(fork_point.id)
            self._context.replay(self._restore)
            self._leaf = fork_point.id
            self._sequence = fork_point.sequence
        self.loom.register_entity(
            EntityRecord(
                entity_id=self.id,
                cantrip_id=cantrip.id,
                identity=setup.identity,
                medium=self.circle.medium.name,
                llm=setup.llm_name,
                parent_entity_id=parent_entity_id,
                spawned_from=spawned_from,
                created_at=_now(),
                forked_from=fork_point.id if fork_point is not None else None,
                fork_strategy=fork_strategy(self.circle.medium) if fork_point else None,
            )
        )

    # -- lifecycle -------------------------------------------------------------

    @property
    def turns(self) -> Sequence[Turn]:
        return self.loom.entity_turns(self.id)

    @property
    def leaf(self) -> str | None:
        """The id of this entity's latest turn: where its thread continues."""
        return self._leaf

    async def aclose(self) -> None:
        """End the entity: its medium state and gate providers are released; its
        record endures (ENTITY-4)."""
        self._closed = True
        try:
            if self._session is not None:
                session, self._session = self._session, None
                await session.aclose()
        finally:
            if self._providers is not None:
                providers, self._providers = self._providers, None
                await providers.aclose()

    async def __aenter__(self) -> Entity:
        if self.cantrip.circle.providers and self._providers is None:
            # The entity's nursery: its gate providers (MCP sessions) live here,
            # across every cast until the entity is closed.
            self._providers = await ProviderScope.enter()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the loop --------------------------------------------------------------

    async def send(
        self, intent: str | None, *, tags: Mapping[str, Any] | None = None
    ) -> CastResult:
        """One cast on this entity: run ``intent`` until done or a ward (ENTITY-5).

        ``tags`` are recorded in the extras of the cast's first turn, so what a
        front end knows about the request (an idempotency key) is in the loom.

        Wards: ``max_turns`` and ``max_tokens_total`` are checked after each turn;
        ``timeout_s`` cuts the cast off wherever it is. Cancellation from outside
        (a parent ending, an API call) is recorded as a truncated turn -- with the
        in-flight gate calls completed as ``cancelled`` -- and then re-raised.
        """
        intent = require_intent(intent)
        cast = _Cast(intent, self._meter(), dict(tags or {}))
        return await self._run_cast(cast, fresh=True)

    async def resume_cast(self, intent: str, recorded: Sequence[Turn]) -> CastResult:
        """Continue a cast that an earlier incarnation of this entity began and never
        finished (its worker died): ``recorded`` are the cast's turns already in the
        loom -- they count toward the wards -- and the turn that was in flight
        continues from the gate journal (its utterance and recorded gate results are
        reused; see cantrip._journal). The intent is already in the context."""
        intent = require_intent(intent)
        cast = _Cast(intent, self._meter())
        for turn in recorded:
            cast.add(turn)
            if turn.extras.get("phase") not in ("continuation", "continuation+checkpoint"):
                cast.utterances += 1
        self._continuing = True
        return await self._run_cast(cast, fresh=not recorded)

    async def _run_cast(
        self,
        cast: _Cast,
        *,
        fresh: bool,
        first: Callable[[], Awaitable[CastResult | None]] | None = None,
    ) -> CastResult:
        """Run a cast's loop (after ``first``, a step that continues a paused turn),
        with the timeout ward, and record how it ends whatever ends it."""
        if self._closed:
            raise IntentError(f"entity {self.id} is closed; summon a new one")
        try:
            if self.cantrip.circle.providers and not self._provided:
                per_cast = await self._open_providers()
                if per_cast is not None:
                    try:
                        result = await self._run_cast_here(cast, fresh=fresh, first=first)
                    finally:
                        self._provided = False
                        self._providers = None
                        await per_cast.aclose()
                    return self._with_undelivered(result)
            return self._with_undelivered(await self._run_cast_here(cast, fresh=fresh, first=first))
        finally:
            self._steering.clear()  # a message never outlives the cast it was sent to

    def _with_undelivered(self, result: CastResult) -> CastResult:
        if not self._steering:
            return result
        return attrs.evolve(result, undelivered=tuple(self._steering))

    def steer(self, text: str) -> bool:
        """Send a message to the running cast: it joins the cast's next turn, as a
        user message recorded in that turn (``extras["steering"]``), so the thread,
        exports and the viewer show it where the model saw it. A code medium's
        entity receives it between turns, never inside running code. Returns
        whether a cast was running to take it; one that ends before another turn
        reports the message in :attr:`CastResult.undelivered`."""
        text = text.strip()
        if not text:
            raise IntentError("a steering message needs some text")
        if self._cast is None:
            return False
        self._steering.append(text)
        return True

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

    async def _open_providers(self) -> ProviderScope | None:
        """Open the circle's gate providers and add their gates to this entity's
        circle. Returns the scope when it lives for this cast only (no entity
        nursery and none lent); a provider that fails to open raises
        :class:`~cantrip.ProviderStartError` before any turn is taken."""
        base = self.cantrip.circle
        scope = self._providers
        per_cast: ProviderScope | None = None
        if scope is None:
            if self.provider_nursery is not None:
                scope = ProviderScope.lent(self.provider_nursery)
            else:
                scope = per_cast = await ProviderScope.enter()
            self._providers = scope
        try:
            gates = await scope.open_all(base.providers, base.gates)
        except BaseException:
            # open_all closed what it had opened; the entity's own nursery stays
            # for __aexit__, a per-cast one is left now, a lent one is forgotten.
            if not scope.owns_nursery or per_cast is not None:
                self._providers = None
            if per_cast is not None:
                await per_cast.aclose()
            raise
        self.circle = base.with_provided((*gates, *self._offered))
        self._setup = attrs.evolve(self._setup, tools=self.circle.tools())
        self._provided = True
        return per_cast

    async def _run_cast_here(
        self,
        cast: _Cast,
        *,
        fresh: bool,
        first: Callable[[], Awaitable[CastResult | None]] | None,
    ) -> CastResult:
        if self._session is None:
            self._session = await self._open_session()
        if fresh:
            self._context.add_intent(cast.intent)
        self._cast = cast
        timeout = self.circle.resolved.get("timeout_s")
        deadline = math.inf if timeout is None else trio.current_time() + float(timeout)
        scope = self._scope = trio.CancelScope(deadline=deadline)
        if self._cancel_next is not None:  # a cancel that arrived just before (sticky)
            self._cancel_requested, self._cancel_reason = True, self._cancel_next
            self._cancel_next = None
            scope.cancel()
        try:
            with scope:
                outcome = None
                if first is not None:
                    outcome = await first()
                if outcome is None:
                    outcome = await self._loop(cast)
                await self.loom.sync(self.id)
                return outcome
            turn = self._record_cut(
                cast, self._cancel_reason if self._cancel_requested else "timeout"
            )
            await self.loom.sync(self.id)
            return cast.result(self.id, turn, None)
        except _PauseExit as paused:
            await self._sync_shielded()
            return self._paused_result(cast, paused.pause)
        except LLMError:
            await self._sync_shielded()
            raise  # already recorded as an llm_error turn
        except LeaseLostError:
            raise  # nothing more can be recorded: another worker owns the entity now
        except CastSuspended:
            raise  # stopped between turns on purpose: nothing to record
        except Exception:
            # A runtime bug: record what happened, then crash to the supervisor.
            self._record_cut(cast, "crashed")
            await self._sync_shielded()
            raise
        except BaseException as exc:
            # Cancellation, possibly grouped by a nursery (a batch of children).
            if _is_cancellation(exc):
                self._record_cut(cast, self.cancel_reason)
                await self._sync_shielded()
            raise
        finally:
            self._inflight = None
            self._cast = None
            self._scope = None
            self._cancel_requested = False
            self._continuing = False
            self._cancel_reason = "cancelled"

    async def _sync_shielded(self) -> None:
        """Make a cut-off turn durable even while the cast is being cancelled (LOOM-1)."""
        with trio.CancelScope(shield=True):
            await self.loom.sync(self.id)

    def _meter(self) -> CostMeter:
        """This cast's cost meter, charging the cast that spawned it (if any)."""
        limit = self.circle.resolved.get("max_cost_usd")
        parent = CURRENT_ENTITY.get(None)
        parent_cast = parent._cast if parent is not None and parent is not self else None
        return CostMeter(
            limit=None if limit is None else float(limit),
            parent=parent_cast.meter if parent_cast is not None else None,
        )

    def _cost_refusal(self, cast: _Cast) -> str | None:
        """Why the cost ward forbids the next LLM call (``None``: go ahead).

        A model with no price is refused before its first call (unless its
        provider reports each call's cost): a budget it cannot measure cannot be
        kept. Otherwise the least the call costs is its prompt at the input
        price; the prompt is estimated from the last call's tokens plus what was
        added since (about four characters a token), so no turn re-reads the
        history."""
        pricing = llm_pricing(self.llm)
        if pricing is None:
            return cast.meter.refusal(unpriced=unpriced_model(self.llm))
        added = 0  # characters recorded since the last call that reported tokens
        for turn in reversed(cast.turns):
            metadata = turn.metadata
            added += len(turn.observation)
            if metadata.tokens_prompt:
                tokens = metadata.tokens_prompt + metadata.tokens_completion + added // 4
                break
        else:
            tokens = sum(len(m.text()) for m in self._context.snapshot()) // 4
        return cast.meter.refusal(prompt_cost(tokens, pricing))

    async def _open_session(self) -> MediumSession:
        """The medium session, with a fork's or resumed entity's sandbox replayed into it."""
        session = await self.circle.medium.open(self.circle.resolved)
        if self._restore:
            try:
                self.restore_report = await restore_session(
                    session, self.circle, self.loom, self._restore
                )
            except BaseException:
                with trio.CancelScope(shield=True):
                    await session.aclose()
                raise
            self._restore = ()
        return session

    async def _loop(self, cast: _Cast) -> CastResult:
        session = self._session
        assert session is not None
        setup = self._setup
        llm = setup.query_llm
        loom = self.loom
        while True:
            await loom.sync(self.id)  # LOOM-1 on a deferred store (a no-op on the others)
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._suspend:  # a turn boundary: every turn so far is durable
                self._suspend = False
                raise CastSuspended(f"entity {self.id}: the cast was suspended between turns")
            if cast.meter.bounded:
                refusal = self._cost_refusal(cast)
                if refusal is not None:
                    turn = self._record_cut(cast, "max_cost_usd", observation=refusal)
                    return cast.result(self.id, turn, None)
            if self._context.fold_pending:
                await self._context.complete_fold()  # an async folder (LLMFolder) folds here
            emit = self._emit if self.on_event is not None else None
            inflight = self._inflight = _Inflight(time.perf_counter(), _now())
            if self._steering:
                inflight.steering = tuple(self._steering)
                self._steering.clear()
                self._context.add_steering(inflight.steering)
            if emit is not None:
                emit(StepStart(sequence=self._sequence + 1))
            journal: TurnJournal | None = None
            replayed: Response | None = None
            if loom.journaled:
                journal = await self._turn_journal()
                replayed = journal.utterance
            try:
                if replayed is not None:
                    response = replayed  # the answer a crashed attempt of this turn got
                elif emit is not None and can_stream(llm):
                    response = await llm.stream(
                        self._context.snapshot(),
                        setup.tools,
                        setup.tool_choice,
                        setup.extra,
                        on_event=emit,
                    )
                else:
                    response = await llm.query(
                        self._context.snapshot(), setup.tools, setup.tool_choice, setup.extra
                    )
                response.validate()
            except LLMError as error:
                ended = self._llm_failed(cast, inflight, error)
                if ended is not None:
                    return ended
                continue  # an operational failure stays in the loop (D-011)
            if journal is not None and replayed is None:
                await journal.record_utterance(response)
            if emit is not None:
                emit(MessageComplete(response=response))
                emit(UsageEvent(usage=response.usage))
            inflight.response = response
            host = inflight.host = _TurnHost(
                self.circle, emit, journal, self._gate_call if self.circle.needs_humans else None
            )
            cast.utterances += 1
            token = CURRENT_ENTITY.set(self)
            try:
                execution = await session.execute(response, host)
            finally:
                CURRENT_ENTITY.reset(token)
            cap = self.circle.resolved.get("max_observation_chars")
            execution = capped_execution(execution, int(cap or OBSERVATION_CAP_CHARS))
            ended = self._conclude(cast, inflight, execution, emit)
            if ended is not None:
                return ended
            # Nothing of a finished turn should wait through the next LLM call but
            # what the loom and the context keep.
            del response, execution, host, token

    async def _turn_journal(self) -> TurnJournal:
        """The journal of the turn about to be taken; what a crashed attempt of it
        left there is read only when continuing an interrupted cast."""
        sequence = self._sequence + 1
        entries = []
        if self._continuing:
            self._continuing = False
            entries = await self.loom.journal_read(self.id, sequence)
        return TurnJournal(self.loom, self.id, sequence, entries)

    def _llm_failed(self, cast: _Cast, inflight: _Inflight, error: LLMError) -> CastResult | None:
        """Record a turn whose LLM call failed; the cast's result if it ends here.

        A transient failure that outlasted the retries stays in the loop as an
        ``is_error`` observation (D-011); anything else is re-raised."""
        transient = self._transient(error)
        cast.utterances += 1
        max_turns = self.circle.resolved.max_turns
        last = max_turns is not None and cast.utterances >= max_turns
        failed = self._failed_turn(cast.intent_for_turn(), error, inflight, transient, last)
        self._record(failed)
        self._inflight = None
        cast.add(failed)
        if self.on_event is not None:
            self._emit(StepComplete(turn=failed))
        if not transient:
            raise error
        return cast.result(self.id, failed, None) if last else None

    def _conclude(
        self,
        cast: _Cast,
        inflight: _Inflight,
        execution: Execution,
        emit: Callable[[Event], None] | None,
    ) -> CastResult | None:
        """Record an executed utterance as a turn; the cast's result if it ends here."""
        response, host = inflight.response, inflight.host
        assert response is not None and host is not None
        wards = self.circle.resolved
        reason: str | None = None
        cut = execution.text_only and response.stop_reason == "max_tokens"
        if cut:
            # Cut off by the output-token limit: never a final answer (issue 22).
            terminated, result = False, None
            observation, reason = self._cut_off(cast, response, wards)
        else:
            terminated, result, observation = self._outcome(
                response, execution, wards.require_done_tool
            )
            if terminated and execution.text_only and cast.continuations:
                result = (cut_text(cast.turns) or "") + (response.content or "")
        if terminated:
            reason = "text" if execution.text_only else "done"
        elif reason is None:
            max_turns = wards.max_turns
            max_tokens = wards.get("max_tokens_total")
            if max_turns is not None and cast.utterances >= max_turns:
                reason = "max_turns"
            elif (
                max_tokens is not None
                and cast.tokens
                + (response.usage.total_tokens if inflight.checkpoint_id is None else 0)
                >= max_tokens
            ):
                reason = "max_tokens_total"
            elif cast.meter.bounded and self._spent_after(cast, response, inflight):
                reason = "max_cost_usd"
        truncated = not terminated and reason is not None
        utterance: dict[str, Any] = {
            "utterance": _utterance(response),
            "content": response.content,
            "thinking": response.thinking,
            "tool_calls": response.tool_calls,
            "reasoning": response.reasoning,
        }
        extras = {**execution.extras, "cut_off": "max_tokens"} if cut else execution.extras
        gate_calls = execution.gate_calls
        if inflight.checkpoint_id is not None:
            # The utterance is in the checkpoint; this turn completes it.
            utterance = {}
            extras = {**extras, "phase": "continuation"}
            gate_calls = tuple(host.records[inflight.recorded_upto :])
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                observation=observation,
                gate_calls=gate_calls,
                metadata=_metadata(
                    response,
                    inflight.started,
                    inflight.timestamp,
                    # a checkpoint already carries this reply's usage (PROD-3)
                    count_usage=inflight.checkpoint_id is None,
                    llm=self.llm,
                    prices=cast.prices,
                ),
                terminated=terminated,
                truncated=truncated,
                reason=reason,
                result=result if terminated else None,
                extras=extras,
                **utterance,
            )
        )
        self._inflight = None
        cast.add(turn)
        if emit is not None:
            emit(StepComplete(turn=turn))
            if terminated:
                emit(FinalResponse(result=result))
        if terminated or truncated:
            if terminated and reason == "done" and self.circle.output is not None:
                result = self.circle.output.load(result)  # the parsed value (a model)
            return cast.result(self.id, turn, result if terminated else None)
        return None

    def _spent_after(self, cast: _Cast, response: Response, inflight: _Inflight) -> bool:
        """Whether this turn (not yet charged) uses up a cost budget."""
        if inflight.checkpoint_id is not None:
            return cast.meter.exhausted_by(0.0)  # the checkpoint carried this reply's cost
        return cast.meter.exhausted_by(response_cost(response, self.llm, cast.prices))

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

    def _emit(self, event: Event) -> None:
        """Deliver an event, stamped with this entity's id unless it carries one."""
        sink = self.on_event
        if sink is not None:
            sink(event if event.entity_id else attrs.evolve(event, entity_id=self.id))

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
        inflight, cast = self._inflight, self._cast
        if inflight is None or cast is None or inflight.response is None or inflight.host is None:
            raise RuntimeError("checkpoint() is only meaningful while a turn executes")
        fresh = tuple(inflight.host.records[inflight.recorded_upto :])
        if inflight.checkpoint_id is not None and not fresh and not marks:
            return inflight.checkpoint_id
        response = inflight.response
        first = inflight.checkpoint_id is None
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                utterance=_utterance(response) if first else "",
                content=response.content if first else None,
                thinking=response.thinking if first else None,
                tool_calls=response.tool_calls if first else (),
                reasoning=response.reasoning if first else (),
                gate_calls=fresh,
                metadata=_metadata(
                    response, inflight.started, inflight.timestamp, llm=self.llm, prices=cast.prices
                )
                if first
                else TurnMetadata(timestamp=_now()),
                reason="paused" if marks and "pending" in marks else "delegating",
                extras={
                    "phase": "checkpoint" if first else "continuation+checkpoint",
                    **(marks or {}),
                },
            )
        )
        cast.add(turn)
        inflight.checkpoint_id = turn.id
        inflight.recorded_upto = len(inflight.host.records)
        return turn.id

    # -- pauses: humans in the loop (cantrip._approval) ------------------------------

    @property
    def pending(self) -> tuple[Pause, ...]:
        """Calls of this entity (and, while it runs, its children) waiting for a human:
        those a live task waits on, else the one the loom holds at this entity's
        leaf -- after a restart, or a cast that returned ``paused``."""
        live = tuple(w.pause for w in self._board.waiting.values() if w.decision is None)
        if live or self._cast is not None:
            return live
        stored = self._stored_pause()
        return (stored,) if stored is not None else ()

    @property
    def live_pending(self) -> tuple[Pause, ...]:
        """The calls a live task of this entity tree waits on in place (a child's, or
        code's in ``"wait"`` mode): answered by :meth:`answer`, the cast goes on."""
        return tuple(w.pause for w in self._board.waiting.values() if w.decision is None)

    def _stored_pause(self) -> Pause | None:
        if self._leaf is None:
            return None
        last = self.loom.get(self._leaf)
        marker = last.extras.get("pending")
        if last.entity_id != self.id or not isinstance(marker, Mapping):
            return None
        return Pause.from_dict(marker, checkpoint_id=last.id)

    def answer_pauses_with(self, handler: PauseHandler) -> None:
        """Let ``handler`` answer this entity's pauses in place (a front end that can
        ask its human, e.g. ACP's ``session/request_permission``)."""
        self._board.handler = handler
        self.pause_mode = "wait"

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
        waiter = self._board.waiting.get(pause_id)
        if waiter is not None:
            _check_decision(waiter.pause, decision)
            if waiter.decision is not None:
                raise PauseError(f"pause {pause_id} was already answered")
            waiter.decision = decision
            waiter.event.set()
            return None
        stored = self._stored_pause() if self._cast is None else None
        if stored is None or stored.pause_id != pause_id:
            raise PauseError(
                f"entity {self.id} has no pending pause {pause_id!r} (already answered?)"
            )
        _check_decision(stored, decision)
        return await self._continue_paused(stored, decision)

    def recorded_answer(self) -> tuple[Pause, Decision] | None:
        """The answer at this entity's leaf that was recorded but never carried out
        to the end of its turn -- the process (a worker) died after recording it --
        with the pause it answered; None if the leaf is not such an answer."""
        if self._leaf is None or self._cast is not None:
            return None
        last = self.loom.get(self._leaf)
        mark = last.extras.get("answered")
        if last.entity_id != self.id or not isinstance(mark, Mapping) or last.parent_id is None:
            return None
        paused = self.loom.get(last.parent_id)
        marker = paused.extras.get("pending")
        if not isinstance(marker, Mapping) or marker.get("pause_id") != mark.get("pause_id"):
            return None
        decision = Decision.parse({k: v for k, v in mark.items() if k != "pause_id"})
        return Pause.from_dict(marker, checkpoint_id=paused.id), decision

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
        return await self._continue_paused(pause, decision, answered=self.loom.get(self._leaf))

    async def _gate_call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """A gate call in a circle where calls may need a human (the pause)."""
        circle = self.circle
        g = circle.gate(name)
        verdict = circle.verdict(name, args)
        if g is None or verdict == "allow":
            return await self._run_gate(name, args, tool_call_id)
        if verdict == "deny":
            message = f"denied by the approval policy: {g.name} may not be called with these"
            return circle.unexecuted(g.name, args, tool_call_id, "error", message)
        if not g.asks_user and g.name in self._board.always:
            return await self._run_gate(name, args, tool_call_id)
        try:
            g.validate(args)  # a human is never asked about a call that cannot run
        except GateArgumentError as exc:
            return circle.unexecuted(g.name, args, tool_call_id, "error", str(exc))
        pause = self._open_pause(g, args, tool_call_id)
        decision = await self._await_decision(pause)
        return await self._apply_decision(pause, decision)

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
        if not self.questions_in_calls:
            return Decision.deny("no one can be asked during a call here")
        pause = Pause(
            pause_id=new_pause_id(),
            entity_id=self.id,
            kind="question",
            gate=gate,
            question=question,
            origin=origin,
            schema=schema,
            url=url,
        )
        inflight = self._inflight
        recording = (
            self._cast is not None
            and inflight is not None
            and inflight.response is not None
            and inflight.host is not None
        )
        pause = self._post_pause(pause, checkpoint=recording)
        decision = await self._await_decision(pause)
        if recording:
            self.checkpoint(marks={"answered": {"pause_id": pause.pause_id, **decision.to_dict()}})
            await self.loom.sync(self.id)
        return decision

    def _open_pause(self, g: Gate, args: Mapping[str, Any], tool_call_id: str | None) -> Pause:
        question = args.get("question") if g.asks_user else None
        pause = Pause(
            pause_id=new_pause_id(),
            entity_id=self.id,
            kind="question" if g.asks_user else "approval",
            gate=g.name,
            args=args,
            tool_call_id=tool_call_id,
            question=None if question is None else str(question),
        )
        return self._post_pause(pause)

    def _post_pause(self, pause: Pause, *, checkpoint: bool = True) -> Pause:
        """Record ``pause`` as pending in the loom, list it, and tell the event sink."""
        if checkpoint:
            checkpoint_id = self.checkpoint(marks={"pending": pause.to_dict()})
            pause = attrs.evolve(pause, checkpoint_id=checkpoint_id)
        self._board.waiting[pause.pause_id] = _Waiter(pause)
        log.info("%s paused: %s %s waits for a human", self.id, pause.kind, pause.gate)
        if self.on_event is not None:
            self._emit(PauseEvent(pause=pause))
        return pause

    async def _await_decision(self, pause: Pause) -> Decision:
        board = self._board
        waiter = board.waiting[pause.pause_id]
        try:
            if board.handler is None and (
                (self.pause_mode == "return" and self._returnable(pause))
                or self.pause_mode == "leave"
            ):
                raise _PauseExit(pause)
            policy = self.circle.approval
            timeout = policy.timeout_s if policy is not None and pause.kind == "approval" else None
            with trio.move_on_after(math.inf if timeout is None else timeout):
                async with trio.open_nursery() as nursery:
                    if board.handler is not None:
                        nursery.start_soon(self._ask_human, board.handler, waiter)
                    await waiter.event.wait()
                    nursery.cancel_scope.cancel()
            if waiter.decision is None:
                waiter.decision = Decision.deny("timed out")
            return waiter.decision
        finally:
            board.waiting.pop(pause.pause_id, None)

    def _returnable(self, pause: Pause) -> bool:
        """A cast can leave at a pause only between tool calls, not inside running code."""
        inflight = self._inflight
        calls = inflight.response.tool_calls if inflight and inflight.response else ()
        return pause.origin is None and any(
            c.id == pause.tool_call_id and c.name == pause.gate for c in calls
        )

    async def _ask_human(self, handler: PauseHandler, waiter: _Waiter) -> None:
        decision = await handler(waiter.pause)
        if waiter.decision is None:  # an answer from elsewhere may have come first
            _check_decision(waiter.pause, decision)
            waiter.decision = decision
            waiter.event.set()

    async def _apply_decision(
        self, pause: Pause, decision: Decision, *, recorded: bool = False
    ) -> GateCallRecord:
        """Record the answer, then carry it out: the gate runs at most once per answer.

        The answer is durable before the effect (on a deferred store -- PostgreSQL --
        the loom is synced), so a worker that dies after this point leaves a loom
        that says the answer was given: the next worker carries it out through the
        journal (:meth:`carry_out_recorded_answer`) instead of taking it again."""
        if not recorded:
            self.checkpoint(marks={"answered": {"pause_id": pause.pause_id, **decision.to_dict()}})
            await self.loom.sync(self.id)
        if decision.always:
            self._board.always.add(pause.gate)
        circle = self.circle
        approval: dict[str, Any] = {"pause_id": pause.pause_id, "decision": decision.kind}
        if decision.reason:
            approval["reason"] = decision.reason
        if pause.origin is not None:
            # Only a process that stopped while the call asked gets here (answered from
            # the loom): the call that asked is gone, so the answer reaches nobody.
            message = (
                f"the call was cut off while {pause.origin} waited for the user's answer "
                "(the process stopped); the answer was not delivered"
            )
            record = circle.unexecuted(pause.gate, pause.args, pause.tool_call_id, "error", message)
        elif decision.kind == "deny":
            who = (
                "the user declined to answer" if pause.kind == "question" else "denied by the user"
            )
            message = f"{who}: {decision.reason or 'no reason given'}"
            record = circle.unexecuted(pause.gate, pause.args, pause.tool_call_id, "error", message)
        elif pause.kind == "question":
            record = GateCallRecord(
                gate=pause.gate,
                args=pause.args,
                result=decision.text,
                tool_call_id=pause.tool_call_id,
            )
        elif decision.kind == "edit" and decision.args is not None:
            approval["original_args"] = dict(pause.args)
            return await self._apply_edit(pause, decision.args, approval)
        else:
            record = await self._run_gate(pause.gate, pause.args, pause.tool_call_id)
        return attrs.evolve(record, detail={**record.detail, "approval": approval})

    async def _apply_edit(
        self, pause: Pause, args: Mapping[str, Any], approval: Mapping[str, Any]
    ) -> GateCallRecord:
        """Run the human's edited arguments -- as a new call: they are validated and
        judged by the approval policy like the model's own (issue 28, item 7). Denied:
        an error observation with the reason; "ask": a new pause for these arguments
        (answered like any other, here or by any later process); allowed: the gate runs.
        Every answer, in place or from the loom, in any process, comes through here."""
        circle = self.circle
        g = circle.gate(pause.gate)
        message: str | None = None
        if g is not None:
            policy = circle.approval
            try:
                g.validate(args)  # the policy only ever judges arguments that can run
                verdict = policy.verdict(g.name, args) if policy is not None else "allow"
            except GateArgumentError as exc:
                message = f"the edited arguments were refused: {exc}"
            else:
                if verdict == "deny":
                    message = (
                        f"denied by the approval policy: {g.name} may not be called with the "
                        "edited arguments"
                    )
                elif verdict == "ask":
                    again = self._open_pause(g, args, pause.tool_call_id)
                    return await self._apply_decision(again, await self._await_decision(again))
        if message is not None:
            record = circle.unexecuted(pause.gate, args, pause.tool_call_id, "error", message)
        else:
            record = await self._run_gate(pause.gate, args, pause.tool_call_id)
        return attrs.evolve(record, detail={**record.detail, "approval": dict(approval)})

    async def _run_gate(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """Run a gate the human (or the policy) let through, journaled like any call."""
        host = self._inflight.host if self._inflight is not None else None
        if host is not None:
            return await host.run(name, args, tool_call_id)
        return await self.circle.call(name, args, tool_call_id)

    def _paused_result(self, cast: _Cast, pause: Pause) -> CastResult:
        return cast_result(
            cast.turns, entity_id=self.id, usage=cast.usage, cost_usd=cast.meter.total,
            pending=(pause,),
        )  # fmt: skip

    async def _continue_paused(
        self, pause: Pause, decision: Decision, *, answered: Turn | None = None
    ) -> CastResult:
        """Go on with an utterance that a pause recorded in the loom interrupted
        (``answered``: the answer's checkpoint, already recorded by a process that died)."""
        if self._closed:
            raise IntentError(f"entity {self.id} is closed; resume it to answer its pause")
        assert pause.checkpoint_id is not None
        pieces = [self.loom.get(pause.checkpoint_id)]
        while pieces[0].extras.get("phase") == "continuation+checkpoint":
            pieces.insert(0, self.loom.get(str(pieces[0].parent_id)))
        first = pieces[0]
        response = Response(
            content=first.content,
            thinking=first.thinking,
            tool_calls=first.tool_calls,
            model=first.metadata.model,
            provider=first.metadata.provider,
        )
        cast = self._cast = _Cast("", self._meter(), resumed=True)

        async def resume_step() -> CastResult | None:
            if self._session is None:
                self._session = await self._open_session()
            emit = self._emit if self.on_event is not None else None
            inflight = self._inflight = _Inflight(
                time.perf_counter(),
                _now(),
                response=response,
                checkpoint_id=pause.checkpoint_id if answered is None else answered.id,
            )
            journal: TurnJournal | None = None
            if self.loom.journaled and answered is None:
                journal = await self._turn_journal()
            elif self.loom.journaled and answered is not None:
                # the journal the first attempt kept: it was opened before the answer
                # was recorded, at the answer checkpoint's sequence
                entries = await self.loom.journal_read(self.id, answered.sequence)
                journal = TurnJournal(self.loom, self.id, answered.sequence, entries)
            host = inflight.host = _TurnHost(self.circle, emit, journal, self._gate_call)
            cast.utterances += 1
            token = CURRENT_ENTITY.set(self)
            try:
                record = await self._apply_decision(pause, decision, recorded=answered is not None)
                host.records.append(record)
                if emit is not None:
                    emit(ToolResultEvent(record=record))
                done_before = sum(len(p.gate_calls) for p in pieces)
                execution = await self._rest_of_utterance(
                    pause, record, response, host, done_before
                )
            finally:
                CURRENT_ENTITY.reset(token)
            cap = self.circle.resolved.get("max_observation_chars")
            execution = capped_execution(execution, int(cap or OBSERVATION_CAP_CHARS))
            return self._conclude(cast, inflight, execution, emit)

        return await self._run_cast(cast, fresh=False, first=resume_step)

    async def _rest_of_utterance(
        self,
        pause: Pause,
        record: GateCallRecord,
        response: Response,
        host: _TurnHost,
        done_before: int,
    ) -> Execution:
        calls = response.tool_calls
        index = next(
            (i for i, c in enumerate(calls) if c.id == pause.tool_call_id and c.name == pause.gate),
            None,
        )
        if index is not None:  # a tool call of its own: the rest of the calls run now
            records = [record]
            terminated = record.status == "ok" and self.circle.terminates(pause.gate)
            result = record.result if terminated else None
            remaining = calls[index + 1 :]
            if remaining and not terminated:
                assert self._session is not None
                rest = await self._session.execute(
                    attrs.evolve(response, tool_calls=remaining), host
                )
                records.extend(rest.gate_calls)
                terminated, result = rest.terminated, rest.result
            elif remaining:
                records.extend(
                    host.unexecuted(
                        c.name, c.arguments, c.id, "skipped", "skipped: done was called"
                    )
                    for c in remaining
                )
            observation = "\n".join(r.text for r in records if r.executed)
            return Execution(
                gate_calls=tuple(records),
                terminated=terminated,
                result=result,
                observation=observation,
            )
        # Inside code: the process that ran it is gone, so the code cannot go on from
        # the call. The model learns what the human decided and what it did.
        message = (
            f"Your code stopped at {pause.gate}() to wait for a human; it was answered after "
            f"the sandbox had been released, so the rest of that code block did not run. "
            f"The call's outcome: {record.text}"
        )
        skipped = [
            host.unexecuted(c.name, c.arguments, c.id, "skipped", "skipped: the block ended")
            for c in calls[1:]
        ]
        texts = [message, *(r.text for r in skipped)]
        return Execution(
            gate_calls=(record, *skipped),
            terminated=record.status == "ok" and self.circle.terminates(pause.gate),
            result=record.result,
            observation="\n\n".join(texts),
            extras={
                "observations": texts,
                "host_calls": [done_before + 1, *([1] * len(skipped))],
                "sandbox_resets": [0],
            },
        )

    @property
    def cancel_reason(self) -> str:
        """How a cancellation from outside is recorded (COMP-9)."""
        return "parent_terminated" if self.parent_entity_id else "cancelled"

    def _record_cut(self, cast: _Cast, reason: str, *, observation: str | None = None) -> Turn:
        """Record the turn a timeout or cancellation interrupted, losing nothing.

        Gate calls that completed keep their results; the rest of the
        utterance's calls are completed as ``cancelled`` (seed 001).
        """
        inflight = self._inflight
        self._inflight = None
        response = inflight.response if inflight else None
        records = list(inflight.host.records) if inflight and inflight.host else []
        done_ids = {r.tool_call_id for r in records}
        calls = response.tool_calls if response else ()
        continuation = inflight is not None and inflight.checkpoint_id is not None
        if continuation:
            assert inflight is not None
            records = records[inflight.recorded_upto :]
        for call in calls:
            if call.id not in done_ids:
                records.append(
                    self.circle.unexecuted(
                        call.name,
                        call.arguments,
                        call.id,
                        "crashed" if reason == "crashed" else "cancelled",
                        f"{reason}: the call did not complete",
                    )
                )
        started = inflight.started if inflight else time.perf_counter()
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                utterance=_utterance(response) if response and not continuation else "",
                content=response.content if response and not continuation else None,
                thinking=response.thinking if response and not continuation else None,
                tool_calls=() if continuation else calls,
                reasoning=response.reasoning if response and not continuation else (),
                observation=observation or f"cut off: {reason}",
                gate_calls=tuple(records),
                extras=self._cut_extras(continuation),
                metadata=TurnMetadata(
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                    timestamp=inflight.timestamp if inflight else _now(),
                ),
                truncated=True,
                reason=reason,
            )
        )
        cast.add(turn)
        if self.on_event is not None:
            self._emit(StepComplete(turn=turn))  # a cut-off turn is recorded like any other
        return turn

    def _cut_extras(self, continuation: bool) -> dict[str, Any]:
        """Extras of a cut turn: the phase, and whether the cut cost the sandbox its
        state (a Python worker killed mid-code), so a replay resets there (LOOM-13)."""
        extras: dict[str, Any] = {"phase": "continuation"} if continuation else {}
        if getattr(self._session, "cut_lost_sandbox", False):
            extras["sandbox_lost"] = True
        return extras

    def _outcome(
        self, response: Response, execution: Execution, require_done: bool
    ) -> tuple[bool, Any, str]:
        """(terminated, result, observation text) of one executed utterance."""
        if execution.text_only:
            if require_done:
                return False, None, NUDGE_DONE_REQUIRED
            return True, response.content, ""
        return execution.terminated, execution.result, execution.observation

    def _cut_off(self, cast: _Cast, response: Response, wards: WardSet) -> tuple[str, str | None]:
        """(observation, reason) of a text answer the token limit cut off.

        With continuations left (the ``max_continuations`` ward, default 0) the
        model is asked to go on and the pieces are joined when it finishes;
        otherwise the cast ends truncated with reason ``max_tokens``. An answer
        cut off before it said anything is not continued: the same request
        would be cut again.
        """
        allowed = int(wards.get("max_continuations") or 0)
        if response.content and cast.continuations < allowed:
            cast.continuations += 1
            return CONTINUE_CUT_OFF, None
        return "cut off: the answer reached the output token limit (max_tokens)", "max_tokens"

    def _record(self, turn: Turn) -> Turn:
        turn = capped_turn(turn, record_cap(self.circle.resolved))
        self.loom.append(turn)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s turn %d: %s -> %s", self.id, turn.sequence, turn.utterance, turn.observation
            )
        self._context.add_turn(turn)
        self._leaf = turn.id
        self._sequence = turn.sequence
        metadata = turn.metadata
        if metadata.tokens_prompt or metadata.tokens_completion:
            self._usage.add(metadata)
        return turn

    def _transient(self, error: LLMError) -> bool:
        """A provider failure that may pass (rate limit, overload, network) even
        after the retries inside the turn: it becomes an ``is_error`` observation and
        the loop goes on, bounded by the wards (D-011, SPEC.md "Supervision model"). Anything
        else -- an invalid answer, a rejected request, a spent script, a provider that
        nothing answers for (refused, no such host: retried inside the turn, briefly)
        -- ends the cast."""
        if isinstance(error, ProviderError) and error.code == UNREACHABLE:
            return False
        return isinstance(error, ProviderError) and self.cantrip.retry.is_retryable(error)

    def _failed_turn(
        self,
        intent: str | None,
        error: LLMError,
        inflight: _Inflight,
        transient: bool,
        last: bool,
    ) -> Turn:
        if transient:
            observation = f"provider failure after retries, the loop goes on: {error}"
            truncated, reason = last, ("max_turns" if last else None)
        else:
            observation, truncated, reason = f"llm error: {error}", True, "llm_error"
        return self._new_turn(
            intent,
            observation=observation,
            metadata=TurnMetadata(
                duration_ms=(time.perf_counter() - inflight.started) * 1000.0,
                timestamp=inflight.timestamp,
            ),
            truncated=truncated,
            reason=reason,
            extras={"error": str(error), "error_type": type(error).__name__},
        )

    def _new_turn(self, intent: str | None, **fields: Any) -> Turn:
        """The next turn of this entity's thread, with the given contents."""
        cast = self._cast
        if intent is not None and cast is not None and cast.tags:
            fields["extras"] = {**cast.tags, **fields.get("extras", {})}
        inflight = self._inflight
        if inflight is not None and inflight.steering:
            fields["extras"] = {**fields.get("extras", {}), "steering": list(inflight.steering)}
            inflight.steering = ()  # the turn's first piece carries them
        return Turn(
            id=self.loom.new_turn_id(),
            parent_id=self._leaf,
            entity_id=self.id,
            sequence=self._sequence + 1,
            cantrip_id=self.cantrip.id,
            intent=intent,
            **fields,
        )


def _check_decision(pause: Pause, decision: Decision) -> None:
    """A question takes an answer (or a refusal); an approval takes approve/deny/edit."""
    check_decision(pause, decision)


def _is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        cancelled, _rest = exc.split(trio.Cancelled)
        return cancelled is not None
    return False


_second: tuple[int, str] = (-1, "")
"""The last second :func:`_now` formatted, and its text up to the seconds."""


def _now() -> str:
    """UTC now in ISO 8601 with microseconds, as ``datetime.isoformat`` writes it.

    Every turn is stamped, so the date and time of day are formatted once per
    second and only the microseconds per call (a third of the cost)."""
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    if seconds != _second[0]:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (seconds, text)
    return f"{_second[1]}.{micros:06d}+00:00"


def _utterance(response: Response) -> str:
    calls = response.tool_calls
    if not response.content and len(calls) == 1:  # the common shape: one call, no text
        return f"{calls[0].name}({calls[0].arguments_json})"
    parts = [response.content or ""]
    parts.extend(f"{call.name}({call.arguments_json})" for call in response.tool_calls)
    return "\n".join(p for p in parts if p)


def _metadata(
    response: Response,
    started: float,
    timestamp: str,
    *,
    count_usage: bool = True,
    llm: LLM | None = None,
    prices: PriceMemo | None = None,
) -> TurnMetadata:
    usage = response.usage if count_usage else ZERO_USAGE
    return TurnMetadata(
        tokens_prompt=usage.prompt_tokens,
        tokens_completion=usage.completion_tokens,
        tokens_cached=usage.cached_tokens,
        tokens_cache_write=usage.cache_write_tokens,
        tokens_reasoning=usage.reasoning_tokens,
        usage_missing=usage.missing,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        timestamp=timestamp,
        attempts=int(response.metadata.get("attempts", 1)),
        model=response.model,
        provider=response.provider,
        cost_usd=response_cost(response, llm, prices) if count_usage else None,
    )
