"""Running a circle's guardrails: in order, or beside the model call.

:class:`Guard` is built once per circle (``Circle.guard``; ``None`` when it has no
guardrails, so a circle without them pays one attribute test a turn). It sorts the
guardrails by where they apply and runs them:

* :meth:`Guard.check` -- every check of one place on one value, one after another
  in the circle's order (blocking ones first); each sees the value as the one
  before left it, so rewrites compose. Used for ``output``, ``call`` and ``result``
  (the value exists already: there is nothing to run beside), and for the blocking
  ``input`` checks.
* :meth:`Guard.beside` -- the non-blocking ``input`` checks, run in one nursery with
  the model call. The call's answer is returned only once every check passed; the
  first trip cancels the call if it is still running (its answer, if it came, is
  kept for the loom, marked). Such a check may not rewrite: the model is already
  reading the text.

A check that raises, or returns something that is not a verdict, is a
:class:`GuardrailError` naming it: never a pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import trio

from cantrip.guardrails._model import (
    WHERE,
    Answer,
    CheckContext,
    Guardrail,
    GuardrailError,
    Rewrite,
    Trip,
    Where,
)

T = TypeVar("T")


@attrs.frozen
class Tripped:
    """Which check tripped, on what, and why: what the loom records (``extras.guardrail``)."""

    check: str
    where: Where
    why: str
    gate: str | None = None

    def note(self) -> dict[str, Any]:
        note: dict[str, Any] = {"check": self.check, "on": self.where, "why": self.why}
        if self.gate is not None:
            note["gate"] = self.gate
        return note


@attrs.frozen
class Checked(Generic[T]):
    """A value after the checks of one place: possibly rewritten, possibly tripped."""

    value: T
    tripped: Tripped | None = None
    rewrote: tuple[str, ...] = ()
    """Names of the checks that rewrote it, in order."""


async def run_one(
    rail: Guardrail,
    value: Any,
    where: Where,
    gate: str | None = None,
    entity_id: str | None = None,
) -> Trip | Rewrite | None:
    """One check's verdict (``None``: it passed). Anything the check raises, or an
    answer that is not a verdict, becomes a :class:`GuardrailError` naming it."""
    try:
        if rail.with_context:
            answer: Any = rail.check(value, CheckContext(where, gate, entity_id))
        else:
            answer = rail.check(value)
        if answer is None:  # the common case, every call of every turn: nothing more
            return None
        if inspect.isawaitable(answer):
            answer = await answer
    except GuardrailError:
        raise
    except Exception as exc:  # the check's boundary: a failing check never passes
        raise GuardrailError(rail.name, where, f"{type(exc).__name__}: {exc}") from exc
    return _verdict(rail, where, answer)


def _verdict(rail: Guardrail, where: Where, answer: Answer) -> Trip | Rewrite | None:
    if answer is None or answer is True:
        return None
    if answer is False:
        return Trip(f"{rail.name} refused it")
    if isinstance(answer, Trip | Rewrite):
        if where == "input" and isinstance(answer, Rewrite) and not isinstance(answer.value, str):
            raise GuardrailError(rail.name, where, "an input rewrite must be text")
        return answer
    raise GuardrailError(
        rail.name,
        where,
        f"a check answers None/True (pass), False or Trip (trip) or Rewrite, not {answer!r}",
    )


class Guard:
    """A circle's guardrails by place, run as :mod:`this module <cantrip.guardrails._run>`
    says."""

    __slots__ = ("_beside", "_ordered")

    def __init__(self, rails: Iterable[Guardrail]) -> None:
        rails = tuple(rails)
        self._ordered: dict[Where, tuple[Guardrail, ...]] = {}
        self._beside: tuple[Guardrail, ...] = ()
        for where in WHERE:
            mine = [r for r in rails if r.applies(where)]
            if where == "input":
                self._beside = tuple(r for r in mine if not r.blocking)
                mine = [r for r in mine if r.blocking]
            else:
                mine = [r for r in mine if r.blocking] + [r for r in mine if not r.blocking]
            if mine:
                self._ordered[where] = tuple(mine)

    @classmethod
    def of(cls, rails: Sequence[Guardrail]) -> Guard | None:
        return cls(rails) if rails else None

    def has(self, where: Where) -> bool:
        return where in self._ordered or (where == "input" and bool(self._beside))

    @property
    def watches_beside(self) -> bool:
        """Whether input checks run beside the model call."""
        return bool(self._beside)

    async def check(
        self,
        where: Where,
        value: T,
        *,
        gate: str | None = None,
        entity_id: str | None = None,
    ) -> Checked[T]:
        """Run the checks of ``where`` (for ``input``: the blocking ones) on ``value``."""
        rails = self._ordered.get(where)
        if not rails:
            return Checked(value)
        rewrote: tuple[str, ...] = ()
        for rail in rails:
            verdict = await run_one(rail, value, where, gate, entity_id)
            if verdict is None:
                continue
            if isinstance(verdict, Trip):
                return Checked(value, Tripped(rail.name, where, verdict.why, gate), rewrote)
            value = verdict.value
            rewrote = (*rewrote, rail.name)
        return Checked(value, None, rewrote)

    async def beside(
        self,
        texts: Sequence[str],
        call: Callable[[], Awaitable[T]],
        *,
        expected: type[Exception] = Exception,
        entity_id: str | None = None,
    ) -> tuple[T | None, Tripped | None]:
        """Run ``call`` with the non-blocking input checks of ``texts`` beside it.

        Returns ``(answer, None)`` once every check passed, or ``(answer or None,
        tripped)`` on the first trip: the call is cancelled if it has not answered.
        The call's own exception (an LLM error) is raised as itself, after the
        checks (``expected``: the exceptions the caller handles -- anything else is a
        bug and crashes through the nursery); a check's failure wins over the call's
        answer."""
        if not self._beside or not texts:
            return await call(), None
        found: list[Tripped] = []
        answer: list[T] = []
        errors: list[Exception] = []

        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                try:
                    answer.append(await call())
                except expected as exc:  # handed back below, outside the nursery
                    errors.append(exc)

            async def watch(rail: Guardrail, text: str) -> None:
                try:
                    verdict = await run_one(rail, text, "input", None, entity_id)
                    if isinstance(verdict, Rewrite):
                        raise GuardrailError(
                            rail.name,
                            "input",
                            "a check beside the model call cannot rewrite (the model is "
                            "already reading the text): make it blocking = true",
                        )
                except GuardrailError as exc:
                    errors.insert(0, exc)  # a failing check wins over the call's own error
                    nursery.cancel_scope.cancel()
                    return
                if isinstance(verdict, Trip) and not found:
                    found.append(Tripped(rail.name, "input", verdict.why))
                    nursery.cancel_scope.cancel()

            nursery.start_soon(ask)
            for text in texts:
                for rail in self._beside:
                    nursery.start_soon(watch, rail, text)
        if errors and (isinstance(errors[0], GuardrailError) or not found):
            raise errors[0]
        got = answer[0] if answer else None
        if found:
            return got, found[0]
        if got is None and not answer:  # cancelled from outside: the scope re-raises
            raise RuntimeError("the model call ended without an answer")
        return got, None
