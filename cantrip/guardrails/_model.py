"""What a guardrail is: a named check, where it applies, and what it may answer.

A guardrail (issue 43) is a check the circle runs on what goes in and out of an
entity: ``input`` (the intent and each steering message), ``output`` (the final
answer), ``call`` (a gate call's arguments, before it runs and before a human is
asked to approve it) and ``result`` (a gate's result, before the model sees it).

A check answers one of three things: it passes (``None`` or ``True``), it rewrites
the value (:class:`Rewrite`, e.g. a redaction) or it trips (:class:`Trip`, or
``False``). A trip ends the cast with reason ``guardrail``. A check that raises is
not a pass: the cast fails with :class:`GuardrailError`, naming the check.

These are plain values; running them is :mod:`cantrip.guardrails._run`, and the
loop's hooks are :mod:`cantrip._core._guard`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, get_args

import attrs

from cantrip._errors import CantripError, ConstructionError

Where = Literal["input", "output", "call", "result"]
WHERE: tuple[Where, ...] = get_args(Where)


@attrs.frozen
class Trip:
    """The check refuses the value: the cast ends with reason ``guardrail``."""

    why: str


@attrs.frozen
class Rewrite:
    """The check replaces the value (the model, the loom and the caller see ``value``)."""

    value: Any
    why: str = ""


Answer = Trip | Rewrite | bool | None
"""What a check may return: ``None``/``True`` pass, ``False`` trips, or a verdict."""


@attrs.frozen
class CheckContext:
    """What a check is told besides the value: where it runs, and for ``call`` and
    ``result``, the gate's name."""

    where: Where
    gate: str | None = None
    entity_id: str | None = None


CheckFn = Callable[..., "Answer | Awaitable[Answer]"]
"""``fn(value)`` or ``fn(value, context)``, sync or async."""


class GuardrailError(CantripError):
    """A guardrail's check raised or answered something it may not: the cast fails
    (reason ``guardrail_error``) with the check named -- it never silently passes."""

    def __init__(self, check: str, where: str, message: str) -> None:
        self.check = check
        self.where = where
        super().__init__(f"guardrail {check!r} on {where} failed: {message}")


def _where_tuple(value: str | Iterable[str]) -> tuple[Where, ...]:
    items = (value,) if isinstance(value, str) else tuple(value)
    bad = [item for item in items if item not in WHERE]
    if bad or not items:
        raise ConstructionError(
            f"a guardrail applies on one or more of {', '.join(WHERE)}, not {list(items)!r}"
        )
    return tuple(dict.fromkeys(items))  # type: ignore[arg-type]


def _takes_context(fn: CheckFn) -> bool:
    """Whether ``fn`` takes the context as its second argument (decided once)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: value only
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)


@attrs.frozen
class Guardrail:
    """A named check and where it applies.

    ``blocking``: for ``input``, the check runs before the model is asked (a check
    that may rewrite must be blocking -- the model cannot be shown text that is not
    decided yet); by default it runs beside the model call, and nothing the model
    answers is acted on before it passes. ``output``, ``call`` and ``result`` checks
    run on a value that exists already: blocking ones run first, one after another
    (each sees the one before's rewrite), then the others together."""

    name: str
    check: CheckFn = attrs.field(repr=False)
    on: tuple[Where, ...] = attrs.field(converter=_where_tuple)
    blocking: bool = False
    with_context: bool = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConstructionError("a guardrail needs a name")
        if not callable(self.check):
            raise ConstructionError(f"guardrail {self.name!r}: check must be callable")
        object.__setattr__(self, "with_context", _takes_context(self.check))

    def applies(self, where: Where) -> bool:
        return where in self.on


def guardrail(
    check: CheckFn,
    *,
    on: Where | Iterable[Where] = "input",
    name: str | None = None,
    blocking: bool = False,
) -> Guardrail:
    """A guardrail running ``check`` (named after the function unless ``name``)."""
    label = name or getattr(check, "__name__", None) or type(check).__name__
    return Guardrail(label, check, on, blocking)


def guardrail_tuple(value: Iterable[Guardrail] | None) -> tuple[Guardrail, ...]:
    """A circle's guardrails, checked: each a Guardrail, names unique."""
    items = tuple(value or ())
    problems = [
        f"guardrails: {item!r} is not a Guardrail"
        for item in items
        if not isinstance(item, Guardrail)
    ]
    seen: set[str] = set()
    for item in items:
        if isinstance(item, Guardrail):
            if item.name in seen:
                problems.append(f"guardrails: two are named {item.name!r}")
            seen.add(item.name)
    if problems:
        raise ConstructionError(problems)
    return items


def describe(value: Any) -> Mapping[str, Any]:
    """A short, JSON-safe account of a verdict for the loom."""
    if isinstance(value, Trip):
        return {"verdict": "trip", "why": value.why}
    if isinstance(value, Rewrite):
        return {"verdict": "rewrite", "why": value.why}
    return {"verdict": "pass"}
