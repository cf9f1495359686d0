"""What an entity is and where its thread stands: the data every part of the core reads.

The entity's parts -- the turn loop (:mod:`._loop`), turn recording
(:mod:`._recording`), pauses (:mod:`._pauses`) -- are functions and objects over
an :class:`EntityState`; :class:`~cantrip.Entity` is that state with its public
face and its constructors (:mod:`._entity`). The parts know the entity only by
this class, so none of them imports the facade above it. Also here: what an
entity reads from the cantrip that summoned it (:class:`Spell`,
:class:`EntitySetup`), which the cantrip layer above passes in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from cantrip._circle import Circle
from cantrip._context import Context
from cantrip._core._budget import Account
from cantrip._core._cast import Cast, Inflight, UsageTally
from cantrip._core._steering import Steering
from cantrip._events import EventSink
from cantrip._folding import FoldingPolicy
from cantrip._gate import Gate
from cantrip._providers import ProviderScope
from cantrip._replay import ReplayReport
from cantrip._running import CastContext, FollowupRunner
from cantrip.llm._contract import LLM, Message, ToolChoice, ToolDefinition
from cantrip.llm._retry import RetryPolicy
from cantrip.llm._stream import Event
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.medium import MediumSession


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
    @property
    def cast_context(self) -> CastContext | None:
        """What adds to each cast's context before its first turn (memory), if anything."""
        ...


class EntityState:
    """One entity's data: who it is, where its thread stands, the cast it runs.

    Set by :class:`~cantrip.Entity`'s constructor; read and moved on by the parts.
    The fields with a leading underscore are the core's own: its parts read and
    write them, nothing outside ``cantrip._core`` does.
    """

    id: str
    parent_entity_id: str | None
    depth: int
    cantrip: Spell
    llm: LLM
    loom: Loom
    circle: Circle
    """The cantrip's circle, with the gates of its providers and any offered (Entity.offer)."""
    on_event: EventSink | None
    """Receives streaming events of this entity (and its children); see cantrip._events.
    The cantrip installs its trace sink in it (cantrip.tracing._sink)."""
    questions_in_calls: bool
    """Whether a question asked from inside a running call (an MCP server's
    elicitation, :meth:`Entity.ask_during_call`) may wait for an answer; off, it is
    declined at once -- for a host that can reach its human only between requests
    (``cantrip mcp`` answering a 2026-07-28 client without tasks), which could not
    keep the asking call alive until the answer came."""
    provider_nursery: trio.Nursery | None
    """A nursery a long-lived host lends to this entity's gate providers (MCP
    servers), so their sessions outlive one cast without ``async with``."""
    followups: FollowupRunner | None
    """Where the work this entity's casts leave behind runs (memory consolidation):
    its own nursery under ``async with``, one its host lends, or a workers' queue;
    None: run by the cast's caller before ``send`` returns (cantrip._core._followups)."""
    restore_report: ReplayReport | None
    spends_under: Account | None
    """An account a host keeps above this entity's casts (``serve``'s session and
    token budgets, cantrip._core._budget.Account); a child's casts charge its parent's."""

    _setup: EntitySetup
    _context: Context
    _session: MediumSession | None
    _restore: Sequence[Turn]
    """Recorded turns to replay into the sandbox when it opens (forks, resumes)."""
    _leaf: str | None
    _sequence: int
    _usage: UsageTally
    _steering: Steering
    _cast: Cast | None
    _inflight: Inflight | None
    _scope: trio.CancelScope | None
    _cancel_requested: bool
    _cancel_reason: str
    _cancel_next: str | None
    _suspend: bool
    """Set by :meth:`Entity.suspend`: the cast stops at its next turn boundary."""
    _closed: bool
    _continuing: bool
    """Set by :meth:`Entity.resume_cast`: the next turn may continue from the gate journal."""
    _providers: ProviderScope | None
    _provided: bool
    _offered: tuple[Gate, ...]
    """Gates offered to this entity's casts besides its circle's (:meth:`Entity.offer`)."""

    _reserved_turn_id: str | None = None
    """The id :meth:`next_turn_id` promised to the next turn recorded."""

    @property
    def leaf(self) -> str | None:
        """The id of this entity's latest turn: where its thread continues."""
        return self._leaf

    def next_turn_id(self) -> str:
        """The id the next turn this entity records will carry (see
        :class:`cantrip._running.RunningEntity`); :func:`._recording.new_turn` uses it."""
        if self._reserved_turn_id is None:
            self._reserved_turn_id = self.loom.new_turn_id()
        return self._reserved_turn_id

    def _emit(self, event: Event) -> None:
        """Deliver an event, stamped with this entity's id unless it carries one."""
        sink = self.on_event
        if sink is not None:
            sink(event if event.entity_id else attrs.evolve(event, entity_id=self.id))
