"""The cost ward's meter: USD spent by an entity tree, against its budgets.

``max_cost_usd`` is a ward like ``max_tokens_total``, with one difference: a
tree spends it together. Every cast keeps a :class:`CostMeter`; a child's meter
points at the meter of the parent cast that spawned it, so each turn's cost is
charged to the child *and* to every ancestor, and any budget on the way up can
stop the child. The parent then finds its own budget spent and stops too: the
whole tree ends, each entity recording a truncated turn with reason
``max_cost_usd``.

Nothing here reads the loom: the charges are the costs of turns as they are
recorded (``TurnMetadata.cost_usd``), so the meter is O(1) per turn. A cost that
is unknown -- tokens at a price nobody knows, or an answer whose provider reported
no usage -- is never counted as $0: a budget that cannot be measured stops the
cast before its next call, saying which it was.
"""

from __future__ import annotations

import attrs

NO_PRICE_FIX = (
    "(add cost_input_per_1m / cost_output_per_1m for it to the provider config, or give "
    "the LLM a pricing)"
)
PRICE_UNKNOWN = f"a model's price is unknown {NO_PRICE_FIX}"
USAGE_UNKNOWN = (
    "the provider reported no token usage for a call, so what it cost is unknown "
    "(a missing usage is never counted as $0)"
)


@attrs.define(eq=False)
class CostMeter:
    """USD spent by one cast and the casts it spawned."""

    limit: float | None = None
    """This cast's own ``max_cost_usd``, if its circle has one."""
    parent: CostMeter | None = None
    spent: float = 0.0
    unknown: int = 0
    """Turns whose cost nobody knows: tokens at an unknown price, or no usage reported."""
    unknown_why: str | None = None
    """Why the first unknown cost is unknown (the cost ward's message says it)."""

    @property
    def bounded(self) -> bool:
        """Whether any budget applies here (this cast's or an ancestor's)."""
        meter: CostMeter | None = self
        while meter is not None:
            if meter.limit is not None:
                return True
            meter = meter.parent
        return False

    @property
    def total(self) -> float | None:
        """What the tree below this cast spent; ``None`` if a price was unknown."""
        return None if self.unknown else self.spent

    def charge(self, cost: float | None, *, why: str = PRICE_UNKNOWN) -> None:
        """Add a turn's cost here and to every ancestor; ``None`` is unknown, for ``why``."""
        meter: CostMeter | None = self
        while meter is not None:
            if cost is None:
                meter.unknown += 1
                meter.unknown_why = meter.unknown_why or why
            else:
                meter.spent += cost
            meter = meter.parent

    def refusal(self, estimate: float = 0.0, *, unpriced: str | None = None) -> str | None:
        """Why the next call must not be made, or ``None`` if every budget allows it.

        A call is refused when what was spent plus ``estimate`` (the least the
        call will cost) would go over a budget, when a budget is already spent,
        or when a price is unknown: a budget that cannot be measured cannot be
        kept, so the cast stops rather than spend blindly. ``unpriced`` names the
        model about to be called when it has no price at all: then no call to it
        is made, the first included (issue 39, item 16).
        """
        meter: CostMeter | None = self
        while meter is not None:
            limit = meter.limit
            if limit is not None:
                scope = "this cast" if meter is self else "the entity tree"
                if unpriced is not None:
                    return (
                        f"max_cost_usd ${limit:g} cannot be kept: the model {unpriced} has no "
                        f"price, so no call to it can be priced {NO_PRICE_FIX}"
                    )
                if meter.unknown:
                    why = meter.unknown_why or PRICE_UNKNOWN
                    return f"max_cost_usd ${limit:g} cannot be kept: {why}"
                if meter.spent >= limit or meter.spent + estimate > limit:
                    return (
                        f"max_cost_usd: ${meter.spent:.6f} spent by {scope} of a "
                        f"${limit:g} budget; the next call would cost at least ${estimate:.6f}"
                    )
            meter = meter.parent
        return None

    def exhausted_by(self, cost: float | None) -> bool:
        """Whether charging ``cost`` leaves some budget used up. An unknown cost
        (``None``) does not end the turn that incurred it: the next call is refused
        by :meth:`refusal`, whose message says why the budget cannot be kept."""
        if cost is None:
            return False
        meter: CostMeter | None = self
        while meter is not None:
            if meter.limit is not None and (meter.unknown or meter.spent + cost >= meter.limit):
                return True
            meter = meter.parent
        return False
