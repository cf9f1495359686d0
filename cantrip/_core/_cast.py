"""One cast's state and how its result is built.

A cast is one intent run on an entity until it ends (ENTITY-5). While it runs,
its totals (turns, tokens, the cost meter the cost ward reads, continuations)
are kept in a :class:`Cast`, and the turn being taken in an :class:`Inflight`,
enough to record that turn if it is cut off. When the cast ends, its
:class:`~cantrip.CastResult` is built from these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from cantrip._approval import Pause
from cantrip._core._budget import CHILDREN, TreeBudget, charge_turn, recharge
from cantrip._core._host import TurnHost
from cantrip._cost import CostMeter
from cantrip._outcome import CastResult, cast_result
from cantrip.llm._contract import Response, Usage
from cantrip.llm._cost import PriceMemo
from cantrip.loom._model import Turn, TurnMetadata


class UsageTally:
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
class Inflight:
    """The turn being taken: enough to record it if it is cut off."""

    started: float
    timestamp: str
    host: TurnHost | None = None
    """Made once the LLM has answered: nothing of a turn waits on the provider
    that does not have to (every object alive across that wait is one more for
    the garbage collector to scan when thousands of entities wait at once)."""
    asked: bool = False
    """Set as the model is asked: a cut from then until ``response`` arrives lost a
    call that may have run and been billed, whose usage nobody knows."""
    response: Response | None = None
    checkpoint_id: str | None = None
    """Set once a delegation committed part of this turn (see Entity.checkpoint)."""
    recorded_upto: int = 0
    """How many of ``host.records`` the checkpoints already hold."""
    steering: tuple[str, ...] = ()
    """Messages that joined this turn (recorded with its first piece)."""
    notice: tuple[str, ...] = ()
    """The budget notice shown before this turn's call, if due (cantrip._core._budget)."""
    rewrote: tuple[str, ...] = ()
    """Guardrails that rewrote this turn's input or answer (:mod:`cantrip._core._guard`)."""


@attrs.define
class Cast:
    """One cast's running totals."""

    intent: str
    meter: CostMeter = attrs.field(factory=CostMeter)
    """USD spent, charged up the entity tree (the cost ward)."""
    budget: TreeBudget = attrs.field(factory=TreeBudget)
    """Tokens, gate calls and children, charged up the entity tree (cantrip._core._budget)."""
    tags: Mapping[str, Any] = attrs.field(factory=dict)
    """Recorded in the extras of the cast's first turn (e.g. an idempotency key)."""
    turns: list[Turn] = attrs.field(factory=list)
    tally: UsageTally = attrs.field(factory=UsageTally)
    prices: PriceMemo = attrs.field(factory=dict)
    """The model prices this cast's turns were charged at (looked up once)."""
    utterances: int = 0
    """LLM answers this cast; max_turns counts these (a split turn is one)."""
    resumed: bool = False
    """A cast that goes on from a pause: its intent was recorded by the cast it continues."""
    continuations: int = 0
    """Continuations asked for this cast (bounded by the ``max_continuations`` ward)."""
    unchecked_intent: bool = False
    """The intent waits for the input guardrails before it joins the context."""

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
        elif metadata.usage_missing:  # a call whose usage nobody knows: unknown, not $0
            self.tally.missing = True  # ... and so are the cast's tokens (``usage.missing``)
        self._charge(metadata)

    def _charge(self, metadata: TurnMetadata) -> None:
        """Charge a turn's tokens and dollars up the entity tree."""
        charge_turn(self.budget, self.meter, metadata)

    def add_recorded(self, recorded: Sequence[Turn]) -> None:
        """Count the turns an earlier incarnation already recorded for this cast:
        toward the wards, and an utterance per turn that began one."""
        for turn in recorded:
            self.add(turn)
            if turn.extras.get("phase") not in ("continuation", "continuation+checkpoint"):
                self.utterances += 1
        recharge(self.budget, recorded, own=True)

    def add_spawned(self, children: int, turns: Sequence[Turn]) -> None:
        """Charge what the children an earlier incarnation of this cast spawned spent
        (``turns``: theirs and their own children's, read from the loom): their
        tokens and dollars count toward this cast's tree, not its own usage."""
        self.budget.charge(CHILDREN, children)
        for turn in turns:
            self._charge(turn.metadata)
        recharge(self.budget, turns, own=False)

    def result(self, entity_id: str, last: Turn, value: Any) -> CastResult:
        """The cast's result now that ``last`` (its latest turn) ended it; its cost is
        the whole tree's, as the meter charged it."""
        assert self.turns and self.turns[-1] is last
        return cast_result(
            self.turns, entity_id=entity_id, value=value, usage=self.usage,
            cost_usd=self.meter.total,
        )  # fmt: skip

    def paused(self, entity_id: str, pause: Pause) -> CastResult:
        """The cast's result when it leaves at ``pause`` (``pause="return"``)."""
        return cast_result(
            self.turns, entity_id=entity_id, usage=self.usage, cost_usd=self.meter.total,
            pending=(pause,),
        )  # fmt: skip
