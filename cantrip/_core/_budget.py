"""Budgets over the whole entity tree (issue 43, item 2): one account per cast, chained.

A cast keeps a :class:`TreeBudget`; the cast of a child entity (``call_agent``, a
batch's children, A2A and MCP sub-casts that report usage) keeps one whose
``parent`` is the spawning cast's. What a cast spends -- tokens, gate calls, child
entities -- is charged to its own account *and* to every ancestor's, so a budget
set anywhere up the tree counts everything below it, and a child can never
outspend the parent that spawned it (its own ward may be lower, never higher:
wards compose by minimum, WARD-1). Dollars are kept the same way by
:class:`~cantrip._cost.CostMeter`, and wall time by the cancel scopes a child
runs inside; this module reads both when it tells an entity what is left.

When a budget is checked, and what its stop is called (each ward its own reason):

* ``max_tokens_total`` -- before each model call (the cast stops, without making
  it, once any account on the way up is spent) and after each turn (the turn
  that reaches the budget is the last, as for a lone cast, LOOP-4). A call's
  tokens are known only once it is answered, so a tree can go over by the call
  that crosses the budget (one per entity then running), never by more.
* ``max_gate_calls`` -- before each gate call (``done`` and other terminating
  gates are not counted: ending costs nothing). The call that would go over is
  not made: it is recorded as an error, and the cast ends with that turn.
* ``max_children`` -- before each child starts. A child that would go over is
  not started (its gate call, or its batch entry, is an error), and the
  spawning cast ends with that turn; the children that fit run.

Every entity of a tree runs in one trio thread (children of a batch are tasks),
and a check and its charge happen with no checkpoint between them, so
concurrent children draw from the same account without a lock and cannot both
take the last unit. Nothing here reads the loom while a cast runs; a cast
continued by another worker (``Entity.resume_cast``) recharges what its recorded
turns and the children they spawned spent, read from the loom once
(:func:`recorded_tree`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from cantrip._cost import USAGE_UNKNOWN, CostMeter
from cantrip.loom._model import Turn, TurnMetadata

if TYPE_CHECKING:
    from cantrip._wards import WardSet
    from cantrip.loom._loom import Loom

TOKENS = "max_tokens_total"
GATE_CALLS = "max_gate_calls"
CHILDREN = "max_children"
COUNTED = (TOKENS, GATE_CALLS, CHILDREN)
"""The wards an account counts (dollars: the cost meter; wall time: cancel scopes)."""
DEFAULT_NOTICE = 0.8
_UNITS = {TOKENS: "tokens", GATE_CALLS: "gate calls", CHILDREN: "child entities"}


@attrs.define(eq=False)
class TreeBudget:
    """What one cast and the casts it spawned spent, against their budgets."""

    limits: dict[str, int] = attrs.field(factory=dict)
    """This cast's own budgets (its circle's wards), by ward name."""
    parent: TreeBudget | None = None
    spent: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(COUNTED, 0))
    stop: tuple[str, str] | None = None
    """(reason, why) once a refused gate call or child ends this cast after its turn."""
    noticed: bool = False
    """Whether this cast was told how much is left (once per cast)."""

    bounded: bool = attrs.field(init=False, default=False)
    """Whether any budget applies here (this cast's or an ancestor's): fixed when the
    account is made, so a cast with none pays one attribute read a turn."""

    def __attrs_post_init__(self) -> None:
        self.bounded = bool(self.limits) or (self.parent is not None and self.parent.bounded)

    def charge(self, ward: str, amount: int) -> None:
        """Add ``amount`` here and to every ancestor."""
        budget: TreeBudget | None = self
        while budget is not None:
            budget.spent[ward] += amount
            budget = budget.parent

    def refusal(self, ward: str) -> str | None:
        """Why no more of ``ward`` may be spent (``None``: go ahead): some budget on
        the way up is already used up."""
        budget: TreeBudget | None = self
        while budget is not None:
            limit = budget.limits.get(ward)
            if limit is not None and budget.spent[ward] >= limit:
                scope = "this cast" if budget is self else "the entity tree"
                return (
                    f"{ward}: {budget.spent[ward]} {_UNITS[ward]} used by {scope} "
                    f"of a budget of {limit}"
                )
            budget = budget.parent
        return None

    def take(self, ward: str) -> str | None:
        """Take one unit of ``ward`` (a gate call, a child) if every budget allows
        it; otherwise take nothing, and this cast stops after its turn."""
        refused = self.refusal(ward)
        if refused is None:
            self.charge(ward, 1)
        elif self.stop is None:
            self.stop = (ward, refused)
        return refused

    def reached(self, ward: str, extra: int = 0) -> bool:
        """Whether ``extra`` more (a turn's tokens not charged yet) reaches a budget."""
        budget: TreeBudget | None = self
        while budget is not None:
            limit = budget.limits.get(ward)
            if limit is not None and budget.spent[ward] + extra >= limit:
                return True
            budget = budget.parent
        return False

    def notice(
        self, fraction: float, meter: CostMeter, clock: tuple[float, float] | None
    ) -> str | None:
        """What the entity is told, once, when some budget over it is ``fraction``
        used: each budget's use and what is left (``None``: nothing to tell yet).
        ``clock`` is (seconds left, ``timeout_s``) when the cast has a deadline."""
        if self.noticed or fraction <= 0:
            return None
        lines: list[str] = []
        due = False
        for ward, spent, limit in self._tightest():
            used = spent / limit if limit else 1.0
            due = due or used >= fraction
            unit = _UNITS[ward]
            lines.append(f"{ward}: {spent} of {limit} {unit} used, {max(limit - spent, 0)} left")
        cost = _tightest_cost(meter)
        if cost is not None:
            spent_usd, limit_usd = cost
            due = due or (spent_usd / limit_usd if limit_usd else 1.0) >= fraction
            lines.append(
                f"max_cost_usd: ${spent_usd:.4f} of ${limit_usd:g} spent, "
                f"${max(limit_usd - spent_usd, 0.0):.4f} left"
            )
        if clock is not None:
            left_s, limit_s = clock
            due = due or 1 - left_s / limit_s >= fraction
            lines.append(f"timeout_s: {max(left_s, 0.0):.0f} of {limit_s:g} s left")
        if not due:
            return None
        self.noticed = True
        return (
            f"Budget notice: over {fraction:.0%} of a budget of this task is used. "
            + "; ".join(lines)
            + ". Finish within what is left."
        )

    def _tightest(self) -> Iterator[tuple[str, int, int]]:
        """Per counted ward with a budget on the way up: the account most used."""
        for ward in COUNTED:
            best: tuple[str, int, int] | None = None
            budget: TreeBudget | None = self
            while budget is not None:
                limit = budget.limits.get(ward)
                if limit is not None:
                    spent = budget.spent[ward]
                    if best is None or limit - spent < best[2] - best[1]:
                        best = (ward, spent, limit)
                budget = budget.parent
            if best is not None:
                yield best


@attrs.frozen(eq=False)
class Account:
    """An account a host opens above an entity's casts (``serve``'s session and
    token budgets): each cast of the entity charges it as a child's charges its
    parent's, so a budget there counts every cast, and a cast's own wards can only
    be lower. A client cannot lift it: it is no ward of the cantrip's."""

    meter: CostMeter
    budget: TreeBudget

    def charge_turns(self, turns: Sequence[Turn], children: int = 0) -> None:
        """Charge what recorded ``turns`` spent (a session's history, read again
        after a restart), ``children`` of them spawned."""
        self.budget.charge(CHILDREN, children)
        for turn in turns:
            charge_turn(self.budget, self.meter, turn.metadata)
        recharge(self.budget, turns, own=False)


def open_account(limits: Mapping[str, float], above: Account | None = None) -> Account:
    """An account with ``limits`` (budget wards by name), charging ``above``."""
    cost = limits.get("max_cost_usd")
    meter = CostMeter(
        limit=None if cost is None else float(cost),
        parent=above.meter if above is not None else None,
    )
    counted = {ward: int(limits[ward]) for ward in COUNTED if ward in limits}
    return Account(meter, TreeBudget(counted, above.budget if above is not None else None))


def history_account(
    loom: Loom,
    entity_id: str,
    limits: Mapping[str, float],
    above: Account | None = None,
    *,
    besides: Sequence[Turn] = (),
) -> Account:
    """An account above ``entity_id``'s casts (a session's), charged what the loom
    holds of the entity and the children its turns spawned -- but ``besides``, the
    turns of a cast about to be continued, which that cast charges itself."""
    account = open_account(limits, above)
    if loom.has_entity(entity_id):
        skip = {turn.id for turn in besides}
        turns = [t for t in loom.entity_turns(entity_id) if t.id not in skip]
        children, spawned = recorded_tree(loom, entity_id, turns)
        account.charge_turns([*turns, *spawned], children)
    return account


def charge_reported(budget: TreeBudget, detail: Mapping[str, object]) -> None:
    """Charge the tokens a gate call says a sub-cast spent (``detail["usage"]``: an MCP
    tool served by ``cantrip mcp`` reports its cast's) to the calling cast's tree."""
    usage = detail.get("usage")
    if isinstance(usage, Mapping):
        spent = sum(
            n for k in ("prompt_tokens", "completion_tokens") if isinstance(n := usage.get(k), int)
        )
        if spent:
            budget.charge(TOKENS, spent)


def charge_turn(budget: TreeBudget, meter: CostMeter, metadata: TurnMetadata) -> None:
    """Charge a turn's tokens and dollars up the entity tree (a missing usage is an
    unknown cost, never $0)."""
    if metadata.tokens_prompt or metadata.tokens_completion:
        budget.charge(TOKENS, metadata.tokens_prompt + metadata.tokens_completion)
        meter.charge(metadata.cost_usd)
    elif metadata.cost_usd:
        meter.charge(metadata.cost_usd)
    elif metadata.usage_missing:
        meter.charge(None, why=USAGE_UNKNOWN)


def _tightest_cost(meter: CostMeter) -> tuple[float, float] | None:
    best: tuple[float, float] | None = None
    at: CostMeter | None = meter
    while at is not None:
        if at.limit is not None and (best is None or at.limit - at.spent < best[1] - best[0]):
            best = (at.spent, at.limit)
        at = at.parent
    return best


def tree_budget(wards: WardSet, parent: TreeBudget | None) -> TreeBudget:
    """A cast's account under ``wards``, charging ``parent`` (the spawning cast's)."""
    limits = {ward: int(value) for ward in COUNTED if (value := wards.get(ward)) is not None}
    return TreeBudget(limits, parent)


def notice_fraction(wards: WardSet) -> float:
    """The ``budget_notice`` ward (default 80 %; 0 turns the notice off)."""
    value = wards.get("budget_notice")
    return DEFAULT_NOTICE if value is None else float(value)


def budget_notice(
    wards: WardSet, budget: TreeBudget, meter: CostMeter, scope: trio.CancelScope | None
) -> tuple[str, ...]:
    """The notice to show before a cast's next model call, if it is due (at most once
    a cast; ``scope`` is the cast's, whose deadline the ``timeout_s`` ward set). It
    joins the context like a steering message and the turn records it
    (``extras["budget_notice"]``), so a context rebuilt from the loom shows it in the
    same place."""
    if budget.noticed:
        return ()
    timeout = wards.get("timeout_s")
    if not (budget.bounded or timeout or meter.bounded):
        budget.noticed = True  # nothing to tell this cast, ever: checked once
        return ()
    fraction = notice_fraction(wards)
    clock = None
    if timeout and scope is not None and scope.deadline != math.inf:
        clock = (scope.deadline - trio.current_time(), float(timeout))
    text = budget.notice(fraction, meter, clock)
    return () if text is None else (text,)


def recharge(budget: TreeBudget, turns: Sequence[Turn], *, own: bool) -> None:
    """Charge the gate calls recorded ``turns`` made (their tokens and dollars go
    through ``Cast.add``); the cast's ``own`` turns also say whether it was told
    what is left already."""
    for turn in turns:
        counted = sum(1 for call in turn.gate_calls if call.gate != "done")
        if counted:
            budget.charge(GATE_CALLS, counted)
        if own and turn.extras.get("budget_notice"):
            budget.noticed = True


def recorded_tree(loom: Loom, entity_id: str, turns: Sequence[Turn]) -> tuple[int, list[Turn]]:
    """The turns of every entity spawned from ``turns`` (a cast's recorded turns),
    their own children's included: what a cast continued on another worker had
    spent through its children before the handoff (the children ran under the
    lease of the worker that died; the loom holds what they recorded), with how
    many children ``turns`` spawned themselves.

    A child's first turn hangs under the turn that spawned it (COMP-5), so each
    generation is found by the loom's index of children by parent turn -- never by
    reading every entity the database holds."""
    found: list[Turn] = []
    direct: int | None = None
    spawners, parents = list(turns), {entity_id}
    while True:
        children = {
            turn.entity_id
            for spawner in spawners
            for turn in loom.children(spawner.id)
            if turn.entity_id not in parents
            and turn.entity_id != entity_id
            # a fork from one of these turns hangs there too, but is nobody's child
            and loom.entity(turn.entity_id).parent_entity_id in parents
        }
        if direct is None:
            direct = len(children)
        if not children:
            return direct, found
        spawners = [t for child in sorted(children) for t in loom.entity_turns(child)]
        found.extend(spawners)
        parents = children
