"""The circle: one medium, its gates, its wards (chapter 4).

A circle is validated when it is built: it must have the ``done`` gate
(CIRCLE-1) and a ward that guarantees termination (CIRCLE-2, LOOP-2), every
gate dependency must be bound (CIRCLE-10), and gate names must be unique.
At ``max_depth`` 0 delegation gates are removed structurally (COMP-6).

The circle is also the one place gates are called: :meth:`Circle.call` is the
gate-call boundary where a gate's own failures become ``is_error`` records
(CIRCLE-5, seed 002). Nothing else in the runtime catches them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from cantrip._approval import ApprovalPolicy, Verdict
from cantrip._errors import ChildCrashedError, ConstructionError
from cantrip._gate import Gate, GateArgumentError, GateError, GateResult
from cantrip._output import OutputSchema
from cantrip._providers import GateProvider
from cantrip._wards import Ward, WardSet
from cantrip.guardrails._model import Guardrail, guardrail_tuple
from cantrip.guardrails._run import Guard
from cantrip.llm._contract import EMPTY, ToolChoice, ToolDefinition
from cantrip.loom._model import CallStatus, GateCallRecord
from cantrip.medium import Medium

_EPHEMERAL: Mapping[str, Any] = MappingProxyType({"ephemeral": True})
_log = logging.getLogger(__name__)


_default_medium_factory: Callable[[], Medium] | None = None


def set_default_medium(factory: Callable[[], Medium]) -> None:
    """Choose the medium a circle built without one gets.

    The cantrip layer (``cantrip._cantrip``) sets it (conversation, MEDIUM-1) when it
    is imported; the package face loads ``cantrip.Circle`` from that module, so a circle
    built through the public API always has it. The circle stands below the mediums
    and imports none of them."""
    global _default_medium_factory
    _default_medium_factory = factory


def _default_medium() -> Medium:
    if _default_medium_factory is None:  # _circle imported alone, not through the package
        raise ConstructionError("circle needs a medium: none was given and no default is set")
    return _default_medium_factory()


def circle_problems(gates: Sequence[Gate], wards: WardSet) -> list[str]:
    """Everything wrong with a circle, in words a user can act on."""
    problems: list[str] = []
    names = [g.name for g in gates]
    if not any(g.terminates for g in gates):
        problems.append("circle must have a done gate (CIRCLE-1)")
        if wards.require_done_tool:
            problems.append(
                "cantrip with require_done must have a done gate: "
                "require_done_tool makes done the only way to finish (LOOP-2)"
            )
    if not wards.guarantees_termination:
        problems.append(
            "cantrip must have at least one truncation ward, e.g. max_turns (CIRCLE-2, LOOP-2)"
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"gate names must be unique; repeated: {', '.join(duplicates)}")
    for g in gates:
        missing = g.missing_dependencies
        if missing:
            problems.append(
                f"gate {g.name!r} needs its dependencies bound at construction (CIRCLE-10): "
                f"{', '.join(missing)}"
            )
    return problems


def _gate_tuple(value: Iterable[Gate]) -> tuple[Gate, ...]:
    return tuple(value)


def _ward_tuple(value: Iterable[Ward]) -> tuple[Ward, ...]:
    return tuple(value)


def _provider_tuple(value: Iterable[GateProvider]) -> tuple[GateProvider, ...]:
    providers = tuple(value)
    for p in providers:
        if not isinstance(p, GateProvider):
            raise ConstructionError(
                f"circle providers must be gate providers (e.g. cantrip.MCPServer); "
                f"got {type(p).__name__}"
            )
    return providers


@attrs.frozen(eq=False)
class Circle:
    """Medium + gates + wards. Built once, shared by every entity of a cantrip."""

    gates: tuple[Gate, ...] = attrs.field(converter=_gate_tuple)
    wards: tuple[Ward, ...] = attrs.field(converter=_ward_tuple)
    medium: Medium = attrs.field(factory=_default_medium)
    output: OutputSchema | None = attrs.field(default=None, kw_only=True)
    """Set by :meth:`with_output`: the schema ``done``'s answer takes."""
    approval: ApprovalPolicy | None = attrs.field(default=None, kw_only=True)
    """Which calls wait for a human first (besides gates marked ``requires_approval``)."""
    providers: tuple[GateProvider, ...] = attrs.field(default=(), converter=_provider_tuple)
    """Outside tool sources (MCP servers): opened per entity, their gates added to
    that entity's circle (see :mod:`cantrip._providers`)."""
    guardrails: tuple[Guardrail, ...] = attrs.field(
        default=(), kw_only=True, converter=guardrail_tuple
    )
    """Checks on input, output, calls and results (:mod:`cantrip.guardrails`)."""
    resolved: WardSet = attrs.field(init=False)
    _by_name: Mapping[str, Gate] = attrs.field(init=False, repr=False)
    _warded_off: frozenset[str] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        resolved = WardSet.resolve(self.wards)
        gates = self.gates
        warded_off: set[str] = set()
        if resolved.max_depth == 0:
            for g in gates:
                if g.delegates:
                    warded_off.update((g.name, *g.aliases))
            gates = tuple(g for g in gates if not g.delegates)
            object.__setattr__(self, "gates", gates)
        object.__setattr__(self, "_warded_off", frozenset(warded_off))
        problems = circle_problems(gates, resolved)
        if problems:
            raise ConstructionError(problems)
        by_name: dict[str, Gate] = {}
        for g in gates:
            by_name[g.name] = g
        for g in gates:
            for alias in g.aliases:
                by_name.setdefault(alias, g)
        object.__setattr__(self, "resolved", resolved)
        object.__setattr__(self, "_by_name", by_name)

    def with_output(self, output: OutputSchema) -> Circle:
        """This circle with its ``done`` gate answering in ``output``'s schema.

        A structured answer needs the ``done`` gate, so ``require_done_tool`` is
        added: a text-only reply is nudged toward ``done`` instead of ending the cast.
        """
        gates = tuple(output.done_gate(g) if g.terminates else g for g in self.gates)
        wards = (*self.wards, Ward("require_done_tool", True))
        return Circle(
            gates,
            wards,
            self.medium,
            output=output,
            approval=self.approval,
            providers=self.providers,
            guardrails=self.guardrails,
        )

    @functools.cached_property
    def needs_humans(self) -> bool:
        """Whether any call of this circle can pause for a human (checked once)."""
        return (
            (self.approval is not None and self.approval.active)
            or any(g.requires_approval or g.asks_user for g in self.gates)
            or any(getattr(p, "asks_user", False) for p in self.providers)
        )

    @functools.cached_property
    def guard(self) -> Guard | None:
        """The guardrails, sorted for running (``None``: there are none, and the loop
        pays one test a turn)."""
        return Guard.of(self.guardrails)

    def verdict(self, name: str, args: Mapping[str, Any]) -> Verdict:
        """Whether a call runs (allow), is refused (deny) or waits for a human (ask)."""
        g = self._by_name.get(name)
        if g is None:
            return "allow"  # the gate-call boundary reports the unknown gate
        if g.asks_user or g.requires_approval:
            return "ask"
        if self.approval is None:
            return "allow"
        return self.approval.verdict(g.name, args)

    def with_provided(self, gates: Sequence[Gate]) -> Circle:
        """This circle plus gates its providers contributed (an entity's own circle)."""
        return attrs.evolve(self, gates=(*self.gates, *gates), providers=())

    # -- presentation --------------------------------------------------------

    def tools(self) -> tuple[ToolDefinition, ...]:
        """The capability presentation the LLM receives on every query (CIRCLE-11).

        Built once per circle: it changes only when the circle does."""
        return self._tools

    @functools.cached_property
    def _tools(self) -> tuple[ToolDefinition, ...]:
        return self.medium.present(self.gates)

    def tool_choice(self, override: ToolChoice | None = None) -> ToolChoice:
        return override or self.medium.default_tool_choice

    def gate(self, name: str) -> Gate | None:
        return self._by_name.get(name)

    @property
    def gate_names(self) -> list[str]:
        return [g.name for g in self.gates]

    # -- the gate-call boundary ----------------------------------------------

    def terminates(self, name: str) -> bool:
        g = self._by_name.get(name)
        return g is not None and g.terminates

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord:
        """Run one gate call and record its completion; never raises for gate faults."""
        started = time.perf_counter()
        g = self._by_name.get(name)
        if g is None:
            return self._record(
                name, args, tool_call_id, started, self._unknown_gate_message(name), error=True
            )
        name = g.name  # an alias (submit_answer) is recorded under the gate's own name
        detail = _EPHEMERAL if g.ephemeral else EMPTY
        try:
            result = await g.invoke(args)
        except GateArgumentError as exc:
            _log.info("gate %r: arguments refused", name, exc_info=exc)
            return self._record(
                name, args, tool_call_id, started, str(exc), error=True, detail=_kind(exc)
            )
        except Exception as exc:  # the gate-call boundary (CIRCLE-5, D-011)
            if _is_crash(exc):
                raise  # a runtime bug in a child entity: the supervisor's, not the model's
            # A GateError is the gate's own plain-words report: logged quietly. Any
            # other exception is a fault in the gate's code: a warning.
            level = logging.INFO if isinstance(exc, GateError) else logging.WARNING
            _log.log(level, "gate %r raised %s", name, type(exc).__name__, exc_info=exc)
            return self._record(
                name,
                args,
                tool_call_id,
                started,
                gate_error_text(exc),
                error=True,
                detail={**detail, **_reported(exc), **_kind(exc)},
            )
        error = False
        if isinstance(result, GateResult):
            detail = {**detail, **result.detail}
            error = result.is_error
            result = result.value
        return self._record(name, args, tool_call_id, started, result, error=error, detail=detail)

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        return GateCallRecord(
            gate=name,
            args=args,
            result=message,
            is_error=status != "skipped",
            tool_call_id=tool_call_id,
            status=status,
        )

    def _unknown_gate_message(self, name: str) -> str:
        if name in self._warded_off:
            return (
                f"gate {name!r} is warded off: max_depth is 0, so this entity cannot "
                "delegate (COMP-6)"
            )
        known = ", ".join(self.gate_names)
        return f"unknown gate {name!r}: this circle has {known}"

    @staticmethod
    def _record(
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        started: float,
        result: Any,
        *,
        error: bool = False,
        detail: Mapping[str, Any] | None = None,
    ) -> GateCallRecord:
        return GateCallRecord(
            gate=name,
            args=args,
            result=result,
            is_error=error,
            tool_call_id=tool_call_id,
            status="error" if error else "ok",
            duration_ms=(time.perf_counter() - started) * 1000.0,
            detail=detail or EMPTY,
        )


def gate_error_text(exc: BaseException) -> str:
    """What the entity reads for a gate's exception. A :class:`GateError` is the
    gate's own plain-words report and reads as written; anything else keeps its
    type, so ``KeyError('x')`` reads ``KeyError: 'x'`` rather than ``'x'``."""
    if isinstance(exc, GateError):
        return str(exc) or type(exc).__name__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kind(exc: BaseException) -> dict[str, str]:
    """The exception's type for the record's ``detail`` (kept in the loom)."""
    return {"exception": type(exc).__name__}


def _reported(exc: BaseException) -> Mapping[str, Any]:
    """What a :class:`GateError` reports for its record (its ``detail``)."""
    return exc.detail if isinstance(exc, GateError) else EMPTY


def _is_crash(exc: BaseException) -> bool:
    """A child's runtime crash, alone or inside a batch's exception group."""
    if isinstance(exc, ChildCrashedError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_crash(inner) for inner in exc.exceptions)
    return False
