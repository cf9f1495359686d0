"""Wards: subtractive restrictions on the loop, and how they compose (WARD-1/2).

A circle holds any number of :class:`Ward` values. They are *resolved* into one
:class:`WardSet` by kind: numeric limits take the minimum, boolean restrictions
take the logical OR. The same rule composes a child circle's wards with its
parent's, so a child can only ever be more restricted. Nothing here is "first
match wins".

Mediums add their own ward kinds (WARD-2) by registering them with
:func:`register_ward_kind`; they compose with the same rules.

Most wards are checked by the loop in a line (a count, a deadline); the cost
ward needs prices and estimates, so how it is kept at run time is here too
(:func:`cost_meter`, :func:`cost_refusal`, :func:`spent_after`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from cantrip._cost import CostMeter
from cantrip._errors import ConstructionError
from cantrip._suggest import did_you_mean
from cantrip.llm._cost import PriceMemo, llm_pricing, prompt_cost, response_cost, unpriced_model

if TYPE_CHECKING:
    from cantrip.llm._contract import LLM, Message, Response
    from cantrip.loom._model import Turn

WardCombine = Literal["min", "or"]


@attrs.frozen
class WardKind:
    """How one kind of ward is typed and how two values of it compose."""

    name: str
    combine: WardCombine
    truncates: bool = False
    """Whether this ward alone guarantees that the loop ends (CIRCLE-2)."""
    doc: str = ""
    whole_from: int | None = None
    """A kind counted in whole numbers takes an int of at least this (``max_repeats``:
    2, since one call is not a repeat); ``None``: any non-negative number."""
    at_most: float | None = None
    """The largest value the ward takes (``budget_notice``: a fraction, 1)."""


_KINDS: dict[str, WardKind] = {}


def register_ward_kind(kind: WardKind) -> WardKind:
    """Make a ward kind known (mediums call this for their own wards, WARD-2)."""
    existing = _KINDS.get(kind.name)
    if existing is not None and existing != kind:
        raise ConstructionError(f"ward kind {kind.name!r} is already registered differently")
    _KINDS[kind.name] = kind
    return kind


def ward_kinds() -> Mapping[str, WardKind]:
    return dict(_KINDS)


for _kind in (
    WardKind("max_turns", "min", truncates=True, doc="turns per cast"),
    WardKind(
        "timeout_s",
        "min",
        truncates=True,
        doc="wall-clock seconds per cast; the casts it spawns run inside it",
    ),
    WardKind(
        "max_tokens_total",
        "min",
        truncates=True,
        doc="prompt+completion tokens per cast, the casts it spawns included",
    ),
    WardKind("max_cost_usd", "min", doc="USD per cast, the casts it spawns included"),
    WardKind(
        "max_gate_calls",
        "min",
        doc="gate calls (done excepted) per cast, the casts it spawns included",
        whole_from=0,
    ),
    WardKind(
        "max_children",
        "min",
        doc="child entities per cast, the children's own included",
        whole_from=0,
    ),
    WardKind(
        "budget_notice",
        "min",
        doc="the fraction of a budget at which the entity is told, once, what is left "
        "(default 0.8; 0: never)",
        at_most=1.0,
    ),
    WardKind("max_depth", "min", doc="delegation depth below this entity"),
    WardKind("max_concurrency", "min", doc="children of one batch running at once"),
    WardKind("max_batch_size", "min", doc="children in one batch"),
    WardKind("require_done_tool", "or", doc="only the done gate terminates"),
    WardKind(
        "max_continuations",
        "min",
        doc="answers cut off by the output token limit the model may continue per cast",
    ),
    WardKind(
        "max_observation_chars",
        "min",
        doc="characters of one observation; more is cut with a marker (default 65536)",
    ),
    WardKind(
        "max_record_chars",
        "min",
        doc="characters of one gate result a record stores; more is cut, its size and "
        "sha256 kept (default 1048576)",
    ),
    WardKind(
        "max_repeats",
        "min",
        doc="the same gate call, or a turn adding nothing new, this many times in a row "
        "ends the cast (reason loop)",
        whole_from=2,
    ),
):
    register_ward_kind(_kind)


@attrs.frozen
class Ward:
    """One restriction, e.g. ``Ward("max_turns", 10)``. See :func:`max_turns`."""

    kind: str
    value: int | float | bool

    def __attrs_post_init__(self) -> None:
        spec = _KINDS.get(self.kind)
        if spec is None:
            hint = did_you_mean(self.kind, _KINDS) or f" (known wards: {', '.join(sorted(_KINDS))})"
            raise ConstructionError(f"unknown ward {self.kind!r}{hint}")
        if spec.combine == "or":
            if not isinstance(self.value, bool):
                raise ConstructionError(f"ward {self.kind} takes true or false, not {self.value!r}")
        elif spec.whole_from is not None:
            value = self.value
            if isinstance(value, bool) or not isinstance(value, int) or value < spec.whole_from:
                raise ConstructionError(
                    f"ward {self.kind} takes a whole number of at least {spec.whole_from}, "
                    f"not {value!r}"
                )
        elif isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise ConstructionError(f"ward {self.kind} takes a number, not {self.value!r}")
        elif self.value < 0:
            raise ConstructionError(f"ward {self.kind} must not be negative (got {self.value})")
        elif spec.at_most is not None and self.value > spec.at_most:
            raise ConstructionError(
                f"ward {self.kind} takes a number from 0 to {spec.at_most:g}, not {self.value}"
            )

    @classmethod
    def parse(cls, data: Mapping[str, Any] | Ward) -> list[Ward]:
        """Wards from a declarative mapping such as ``{"max_turns": 10}``."""
        if isinstance(data, Ward):
            return [data]
        if not isinstance(data, Mapping) or not data:
            raise ConstructionError(f"a ward is a mapping like {{max_turns: 10}}, not {data!r}")
        return [cls(str(kind), value) for kind, value in data.items()]


def max_turns(n: int) -> Ward:
    return Ward("max_turns", n)


def max_depth(n: int) -> Ward:
    return Ward("max_depth", n)


def require_done_tool(flag: bool = True) -> Ward:
    return Ward("require_done_tool", flag)


def timeout(seconds: float) -> Ward:
    return Ward("timeout_s", seconds)


def max_cost_usd(dollars: float) -> Ward:
    """Stop the entity tree before a call that would spend more than ``dollars``.

    Not a termination guarantee on its own (a model may be free), so a circle
    still needs ``max_turns`` or another truncating ward beside it."""
    return Ward("max_cost_usd", dollars)


@attrs.frozen
class WardSet:
    """The resolved value of every ward kind present in a circle."""

    values: Mapping[str, int | float | bool] = attrs.field(factory=dict)

    @classmethod
    def resolve(cls, wards: Iterable[Ward]) -> WardSet:
        values: dict[str, int | float | bool] = {}
        for ward in wards:
            values[ward.kind] = _combine(ward.kind, values.get(ward.kind), ward.value)
        return cls(values)

    def compose(self, other: WardSet) -> WardSet:
        """Parent and child wards together: min for numbers, OR for booleans."""
        values = dict(self.values)
        for kind, value in other.values.items():
            values[kind] = _combine(kind, values.get(kind), value)
        return WardSet(values)

    def get(self, kind: str) -> int | float | bool | None:
        return self.values.get(kind)

    @property
    def max_turns(self) -> int | None:
        value = self.values.get("max_turns")
        return None if value is None else int(value)

    @property
    def max_depth(self) -> int | None:
        value = self.values.get("max_depth")
        return None if value is None else int(value)

    @property
    def require_done_tool(self) -> bool:
        return bool(self.values.get("require_done_tool", False))

    @property
    def guarantees_termination(self) -> bool:
        return any(_KINDS[kind].truncates for kind in self.values)

    def as_wards(self) -> list[Ward]:
        return [Ward(kind, value) for kind, value in self.values.items()]


def _combine(
    kind: str, current: int | float | bool | None, new: int | float | bool
) -> int | float | bool:
    if current is None:
        return new
    if _KINDS[kind].combine == "or":
        return bool(current) or bool(new)
    return min(current, new)


# -- the cost ward at run time (max_cost_usd) -----------------------------------


def cost_meter(wards: WardSet, parent: CostMeter | None) -> CostMeter:
    """A cast's cost meter under ``wards``, charging ``parent`` (the meter of the cast
    that spawned it, if any): the budget is the whole entity tree's."""
    limit = wards.get("max_cost_usd")
    return CostMeter(limit=None if limit is None else float(limit), parent=parent)


def cost_refusal(
    meter: CostMeter,
    llm: LLM,
    turns: Sequence[Turn],
    history: Callable[[], Sequence[Message]],
) -> str | None:
    """Why the cost ward forbids the next LLM call (``None``: go ahead).

    A model with no price is refused before its first call (unless its
    provider reports each call's cost): a budget it cannot measure cannot be
    kept. Otherwise the least the call costs is its prompt at the input
    price; the prompt is estimated from the last call's tokens plus what was
    added since (about four characters a token), so no turn re-reads the
    history (``history``, the messages the call would send, is read only when
    no turn of the cast reported tokens)."""
    pricing = llm_pricing(llm)
    if pricing is None:
        return meter.refusal(unpriced=unpriced_model(llm))
    added = 0  # characters recorded since the last call that reported tokens
    for turn in reversed(turns):
        metadata = turn.metadata
        added += len(turn.observation)
        if metadata.tokens_prompt:
            tokens = metadata.tokens_prompt + metadata.tokens_completion + added // 4
            break
    else:
        tokens = sum(len(m.text()) for m in history()) // 4
    return meter.refusal(prompt_cost(tokens, pricing))


def spent_after(
    meter: CostMeter, response: Response, llm: LLM, prices: PriceMemo, *, checkpointed: bool
) -> bool:
    """Whether a turn's answer (not yet charged) uses up the cost budget; a
    ``checkpointed`` turn's checkpoint already carried the answer's cost."""
    if checkpointed:
        return meter.exhausted_by(0.0)
    return meter.exhausted_by(response_cost(response, llm, prices))
