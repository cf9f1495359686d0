"""An LLM classifier as a check: a cantrip of its own, whose answer decides.

The classifier is an ordinary cantrip (its own LLM, identity and circle, usually a
conversation with ``done``); each checked value is cast on it as an intent that
names the place (``Check this input:`` ...). Its answer must begin with ``pass``
or ``trip`` (any case; what follows a ``trip`` is the reason). Anything else -- a
cast that ends without an answer, an answer that says neither -- fails the guarded
cast with the check named: a classifier that cannot decide never lets a value by.

The classifier's casts are recorded in its own loom (its cantrip's); the guarded
cast records the verdict (``extras.guardrail`` on a trip).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from cantrip.guardrails._builtins import canonical
from cantrip.guardrails._model import (
    CheckContext,
    Guardrail,
    GuardrailError,
    Trip,
    Where,
)


class _Outcome(Protocol):
    @property
    def terminated(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def text(self) -> str: ...


class Castable(Protocol):
    """What the classifier needs of a cantrip (a :class:`~cantrip.Cantrip`)."""

    async def cast_async(self, intent: str | None) -> Any: ...


PASS_WORDS = ("pass",)
TRIP_WORDS = ("trip",)


def verdict_of(name: str, where: Where, outcome: _Outcome) -> Trip | None:
    """The check's verdict from the classifier cast's outcome."""
    if not outcome.terminated:
        raise GuardrailError(
            name, where, f"the classifier's cast ended without an answer ({outcome.reason})"
        )
    text = outcome.text.strip()
    head, _, rest = text.partition(" ") if " " in text else (text, "", "")
    word = head.strip(".,:;!").lower()
    if word in PASS_WORDS:
        return None
    if word in TRIP_WORDS:
        return Trip(rest.strip(" :-") or "the classifier said trip")
    raise GuardrailError(
        name, where, f"the classifier answered neither pass nor trip: {text[:200]!r}"
    )


def classifier(
    spell: Castable,
    *,
    on: Where | Iterable[Where] = "input",
    name: str = "classifier",
    blocking: bool = False,
) -> Guardrail:
    """A check that casts ``spell`` on each value; its answer (``pass`` or ``trip:
    why``) decides. Input by default, beside the model call."""

    async def check(value: Any, context: CheckContext) -> Trip | None:
        about = f" of gate {context.gate}" if context.gate else ""
        intent = f"Check this {context.where}{about}:\n\n{canonical(value)}"
        outcome = await spell.cast_async(intent)
        return verdict_of(name, context.where, outcome)

    return Guardrail(name, check, on, blocking)
