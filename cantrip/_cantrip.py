"""The cantrip: LLM + identity + circle, bound into a reusable value (1.4).

Casting the same cantrip many times produces independent entities
(CANTRIP-2); they share the cantrip's loom, so every thread of every cast
lands in one tree.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from cantrip._circle import Circle, set_default_medium
from cantrip._core import Entity, EntitySetup, PauseHandler
from cantrip._errors import ConstructionError, LoomError
from cantrip._events import EventSink
from cantrip._folding import FoldingPolicy, effective_policy
from cantrip._identity import Identity
from cantrip._outcome import CastResult
from cantrip._output import OutputSchema
from cantrip._running import CastContext
from cantrip._text import require_intent
from cantrip.llm._contract import LLM, Message
from cantrip.llm._retry import RetryingLLM, RetryPolicy
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.medium import Medium
from cantrip.tracing._sink import with_tracing

if TYPE_CHECKING:
    from cantrip.memory._settings import MemorySettings


def _conversation() -> Medium:
    """Conversation: the Python API's default medium (MEDIUM-1), loaded on first use
    so that ``import cantrip`` stays cheap."""
    from mediums.conversation import conversation

    return conversation


set_default_medium(_conversation)


def cantrip_problems(llm: object, identity: object, circle: object) -> list[str]:
    problems = []
    if llm is None:
        problems.append("cantrip requires an llm (CANTRIP-1)")
    elif not isinstance(llm, LLM):
        problems.append(f"cantrip's llm must implement query(); got {type(llm).__name__}")
    if identity is None:
        problems.append("cantrip requires an identity (CANTRIP-1); Identity() is the minimal one")
    elif not isinstance(identity, Identity):
        problems.append(f"cantrip's identity must be an Identity; got {type(identity).__name__}")
    if circle is None:
        problems.append("cantrip requires a circle (CANTRIP-1)")
    elif not isinstance(circle, Circle):
        problems.append(f"cantrip's circle must be a Circle; got {type(circle).__name__}")
    return problems


_MAX_SETUPS = 64


def _output_schema(value: Any) -> OutputSchema | None:
    return None if value is None else OutputSchema.of(value)


def _new_cantrip_id() -> str:
    return "cantrip-" + uuid.uuid4().hex[:16]


@attrs.frozen(eq=False)
class Cantrip:
    """A value: cast it as often as you like."""

    llm: LLM
    identity: Identity
    circle: Circle
    loom: Loom = attrs.field(factory=Loom)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    folding: FoldingPolicy | None = None
    """Automatic folding of the working context (6.8); None keeps every turn in view."""
    llms: Mapping[str, LLM] = attrs.field(factory=dict)
    """Other LLMs by name: for children (``call_agent(llm=...)``) and forks."""
    id: str = attrs.field(factory=_new_cantrip_id)
    name: str | None = None
    """What people call this cantrip (an A2A Agent Card's name, ...): a spec's ``name``,
    else its file's stem; ``None`` falls back to :attr:`id` where a name is shown."""
    output: OutputSchema | None = attrs.field(default=None, converter=_output_schema)
    """The shape of the answer (a pydantic model, a type or a JSON Schema): ``done``
    takes it as its parameter schema and a cast's ``result`` is the parsed value."""
    memory: MemorySettings | None = None
    """Memory across sessions (:mod:`cantrip.memory`): pinned blocks and recalled items
    added to each cast's context, and the store the memory gates work on."""
    cast_context: CastContext | None = attrs.field(init=False, default=None, repr=False)
    """What adds to each cast's context (the entity reads it; set from ``memory``)."""
    _setups: dict[int, tuple[LLM, EntitySetup]] = attrs.field(factory=dict, init=False, repr=False)
    """EntitySetup per LLM (by identity; the entry keeps its LLM alive, so an id
    cannot be reused while it is cached)."""

    def __attrs_post_init__(self) -> None:
        problems = cantrip_problems(self.llm, self.identity, self.circle)
        if problems:
            raise ConstructionError(problems)
        if self.output is not None and self.circle.output is not self.output:
            object.__setattr__(self, "circle", self.circle.with_output(self.output))
        if self.memory is not None:
            # loaded only for a cantrip with memory: `import cantrip` stays cheap
            from cantrip.memory._cast import MemoryContext
            from cantrip.memory._settings import MemorySettings

            if not isinstance(self.memory, MemorySettings):
                raise ConstructionError(
                    f"cantrip's memory must be a MemorySettings; got {type(self.memory).__name__}"
                )
            object.__setattr__(self, "cast_context", MemoryContext(self.memory, self.loom, self.id))

    def stack(self, llm: LLM) -> LLM:
        """The provider stack a turn queries through: retries inside the turn.

        The order is telemetry -> retry -> fallback -> rate limit -> adapter: a
        telemetry wrapper stays outermost (one record per turn's query, retries
        included), and the retry layer goes right beneath it.
        """
        from cantrip.llm._telemetry import TelemetryLLM

        if isinstance(llm, TelemetryLLM):
            return attrs.evolve(llm, inner=RetryingLLM(llm.inner, self.retry))
        return RetryingLLM(llm, self.retry)

    def setup_for(self, llm: LLM) -> EntitySetup:
        """What every entity of this cantrip with ``llm`` shares (computed once per LLM)."""
        cached = self._setups.get(id(llm))
        if cached is not None and cached[0] is llm:
            return cached[1]
        identity = self.identity
        system = identity.system_prompt
        setup = EntitySetup(
            query_llm=self.stack(llm),
            folding=effective_policy(self.folding, llm),
            tools=self.circle.tools(),
            tool_choice=self.circle.tool_choice(identity.tool_choice),
            extra=MappingProxyType({**identity.hyperparameters(), **identity.extra}),
            identity=MappingProxyType(identity.to_dict()),
            system=Message(role="system", content=system) if system is not None else None,
            llm_name=getattr(llm, "name", None),
        )
        if len(self._setups) >= _MAX_SETUPS:  # LLM objects made per call: do not hoard them
            self._setups.clear()
        self._setups[id(llm)] = (llm, setup)
        return setup

    def event_sink(self, on_event: EventSink | None) -> EventSink | None:
        """The event sink of an entity of this cantrip: ``on_event``, and with
        OpenTelemetry configured a trace sink too (once per entity tree: a child
        given its parent's sink keeps it; cantrip.tracing._sink)."""
        return with_tracing(on_event, self.loom)

    def resolve_llm(self, llm: LLM | str | None) -> LLM:
        if llm is None:
            return self.llm
        if isinstance(llm, str):
            try:
                return self.llms[llm]
            except KeyError:
                known = ", ".join(sorted(self.llms)) or "none"
                raise ConstructionError(f"unknown llm {llm!r} (known: {known})") from None
        return llm

    def summon(
        self,
        *,
        llm: LLM | str | None = None,
        entity_id: str | None = None,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: Literal["return", "wait", "leave"] = "return",
    ) -> Entity:
        """A persistent entity: send it intents, one cast each (ENTITY-5).

        ``on_pause`` answers calls that need a human (approvals, ``ask_user``) in
        place; without it a cast returns ``paused`` (``pause="return"``) or waits
        for :meth:`Entity.answer` (``pause="wait"``)."""
        return Entity.fresh(
            self,
            llm=self.resolve_llm(llm),
            entity_id=entity_id,
            on_event=self.event_sink(on_event),
            on_pause=on_pause,
            pause=pause,
        )

    def resume(
        self,
        entity_id: str,
        *,
        llm: LLM | str | None = None,
        on_event: EventSink | None = None,
        on_pause: PauseHandler | None = None,
        pause: Literal["return", "wait", "leave"] = "return",
    ) -> Entity:
        """The entity ``entity_id`` again, its context rebuilt from its loom thread.

        Used after a crash (the supervisor restarts it) or a process restart
        (``invoke --resume``): turns up to the last committed one are the state.
        A code medium's sandbox is rebuilt the way a fork's is, by replay from
        the loom, when the entity first runs again; no gate is called again.
        """
        return Entity.resumed(
            self,
            entity_id,
            llm=self.resolve_llm(llm),
            on_event=self.event_sink(on_event),
            on_pause=on_pause,
            pause=pause,
        )

    def fork(
        self,
        turn: str | Turn | int,
        *,
        thread: str | None = None,
        llm: LLM | str | None = None,
        entity_id: str | None = None,
        on_event: EventSink | None = None,
    ) -> Entity:
        """A new entity continuing from ``turn`` (LOOM-4): its context is the thread
        from the root to that turn; the original thread is untouched and the two
        share that prefix in the loom. Send it an intent to continue.

        ``turn`` is a :class:`Turn`, a turn id, or a sequence number on
        ``thread`` (an entity id -- its latest thread -- or the id of the turn
        the thread ends at). A code medium's sandbox is rebuilt by replaying
        the thread's code with gate results taken from the loom (LOOM-13), when
        the entity first runs; the entity record notes ``fork_strategy``.
        """
        if isinstance(turn, int):
            if thread is None:
                raise LoomError("a fork by sequence number needs thread= (an entity or turn id)")
            point = self.loom.find(thread, turn)
        else:
            point = self.loom.get(turn) if isinstance(turn, str) else turn
        return Entity.forked(
            self,
            point,
            llm=self.resolve_llm(llm),
            entity_id=entity_id,
            on_event=self.event_sink(on_event),
        )

    async def fork_async(
        self,
        turn: str | Turn | int,
        intent: str | None,
        *,
        thread: str | None = None,
        llm: LLM | str | None = None,
        on_event: EventSink | None = None,
    ) -> CastResult:
        """Fork from ``turn`` (see :meth:`fork`), run ``intent`` there, close the fork."""
        entity = self.fork(turn, thread=thread, llm=llm, on_event=on_event)
        async with entity:
            return await entity.send(intent)

    async def cast_async(
        self,
        intent: str | None,
        *,
        llm: LLM | str | None = None,
        on_event: EventSink | None = None,
    ) -> CastResult:
        """Summon, run one intent, close (ENTITY-1: casting is summoning + cleanup).

        ``on_event`` receives streaming events as the cast runs (spec 7.5)."""
        require_intent(intent)  # before summoning: a refused cast leaves no entity behind
        entity = self.summon(llm=llm, on_event=on_event)
        async with entity:
            return await entity.send(intent)

    def cast(self, intent: str | None, *, llm: LLM | str | None = None) -> CastResult:
        """Synchronous :meth:`cast_async`, for scripts and notebooks without a trio loop."""
        return trio.run(lambda: self.cast_async(intent, llm=llm))

    def with_(self, **changes: Any) -> Cantrip:
        """A new cantrip with some parts replaced (the original is unchanged)."""
        return attrs.evolve(self, **changes)
