"""``serve``'s budgets: per session and per token, set by the server, never by a client.

``cantrip serve --session-budget WARD=N`` bounds what each session spends over all its
prompts (and every child they spawn); ``--token-budget WARD=N`` bounds what every
session served under the server's bearer token spends together (with no token: the
whole server). ``WARD`` is one of the budgets counted over an entity tree
(:data:`SERVE_WARDS`). Both are accounts above the session entity's casts
(:class:`~cantrip._core._budget.Account`): each cast charges them as a child's cast
charges its parent's, and is stopped before a model call, a gate call or a child
that its session's or the token's budget no longer allows, with that ward's reason.

A client cannot lift them: they are not wards of the cantrip, so nothing a request
carries (a prompt, offered client gates, a child's proposed wards, which compose by
minimum) reaches them. A session read again from the loom (after a restart, or
evicted from memory and resumed) is charged what its recorded turns and their
children spent, once; the token's account counts the sessions this server has
served since it started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from cantrip._core._budget import Account, history_account, open_account
from cantrip._errors import ConstructionError
from cantrip._wards import Ward
from cantrip.loom._loom import Loom

SERVE_WARDS = ("max_tokens_total", "max_cost_usd", "max_gate_calls", "max_children")


@attrs.frozen
class ServeBudgets:
    """The budgets a server sets: ``session`` for each session, ``token`` for all."""

    session: Mapping[str, float] = attrs.field(factory=dict)
    token: Mapping[str, float] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, session: Sequence[str] = (), token: Sequence[str] = ()) -> ServeBudgets:
        """From ``WARD=N`` flags; a bad one is a :class:`ValueError` naming it."""
        return cls(_parse("--session-budget", session), _parse("--token-budget", token))

    @property
    def bounded(self) -> bool:
        return bool(self.session or self.token)


def _parse(flag: str, values: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for value in values:
        ward, sep, number = value.partition("=")
        ward = ward.strip()
        if not sep or ward not in SERVE_WARDS:
            raise ValueError(
                f"{flag} takes WARD=N with WARD one of {', '.join(SERVE_WARDS)}, not {value!r}"
            )
        try:
            amount = float(number) if ward == "max_cost_usd" else int(number)
            Ward(ward, amount)  # the ward's own checks (not negative, a whole number)
        except (ValueError, ConstructionError) as exc:
            raise ValueError(f"{flag} {value!r}: {exc}") from None
        out[ward] = amount
    return out


class BudgetBook:
    """The accounts of one server: the token's, and each session's under it."""

    def __init__(self, budgets: ServeBudgets, loom: Loom) -> None:
        self.budgets = budgets
        self.loom = loom
        self.token = open_account(budgets.token) if budgets.bounded else None
        self.sessions: dict[str, Account] = {}

    def account(self, entity_id: str) -> Account | None:
        """The account of the session whose entity is ``entity_id`` (``None``: the
        server sets no budget); made on first use, charged what the loom holds of it."""
        if self.token is None:
            return None
        found = self.sessions.get(entity_id)
        if found is None:
            found = self.sessions[entity_id] = history_account(
                self.loom, entity_id, self.budgets.session, self.token
            )
        return found
