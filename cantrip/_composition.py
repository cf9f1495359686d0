"""Composition: the spawn function behind ``call_agent`` and ``call_agent_batch`` (ch. 5).

A delegation gate hands the entity's proposal to :func:`spawn`, which
validates it and builds the child's circle independently (COMP-1/7):

* **gates** -- the named gates (``done`` always included), taken from the
  parent's circle when it has them (with their bound dependencies) and from
  the built-ins otherwise; default: the parent's gate set;
* **wards** -- the proposal's wards composed with the parent's, numbers by
  min and booleans by OR (WARD-1), so a child is never less restricted;
  ``max_depth`` is the parent's minus one, and at 0 the delegation gates are
  structurally absent (COMP-6/11);
* **llm** -- by name from the cantrip's registry; default: ``child_llm_l<N>``
  for depth N, else ``child_llm``, else the parent's LLM;
* **medium** -- by name; default: the medium the child's LLM declares it
  speaks (a scripted LLM's script says so), else the parent's;
* **identity** -- the proposal's, else a generic worker identity, never the
  parent's system prompt (COMP-10).

The child lives inside the parent's gate call (COMP-2), in the parent's loom
(LOOM-8/12): its root turn points at the parent's delegation checkpoint
(COMP-5). A child that fails -- its LLM gives up, or it crashes -- comes back
as an error the parent sees (COMP-8); a child cut off by a ward is not a
failure: its truncation summary is the result, marked ``truncated``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from cantrip._errors import CantripError, ChildCrashedError, ConstructionError
from cantrip._gate import Gate, GateError
from cantrip._gate_names import gate_names, named_gate
from cantrip._identity import Identity
from cantrip._wards import Ward, WardSet
from cantrip.llm._contract import LLM

if TYPE_CHECKING:
    from cantrip._core import Entity
    from cantrip._outcome import CastResult

CHILD_IDENTITY = (
    "You are a worker entity created for one sub-task. Work only on the intent you "
    "are given, using your gates, and finish by calling done with your answer."
)
DEFAULT_DEPTH = 1
UNSANDBOXED_MEDIUMS = frozenset({"bash"})
DEFAULT_CONCURRENCY = 8
MAX_BATCH = 50
_log = logging.getLogger(__name__)


@attrs.frozen
class ChildOutcome:
    """What a delegation returns to the parent's gate."""

    value: Any
    truncated: bool = False
    entity_id: str = ""
    reason: str | None = None
    """Why a truncated child ended (``max_turns``, ``max_tokens``, ...)."""


def current_entity() -> Entity:
    from cantrip._core import CURRENT_ENTITY

    try:
        return CURRENT_ENTITY.get()
    except LookupError:
        raise GateError("delegation gates can only run inside an entity's turn") from None


async def delegate(request: Mapping[str, Any]) -> ChildOutcome:
    """Run one child to completion inside the calling entity's turn (COMP-2)."""
    parent = current_entity()
    spawn_point = parent.checkpoint()
    return await _run_child(parent, dict(request), spawn_point)


async def delegate_batch(requests: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Run children concurrently; results in request order (COMP-3): the values of
    :func:`delegate_batch_outcome`, for a gate that needs no record of its children."""
    return list((await delegate_batch_outcome(requests)).values)


@attrs.frozen
class BatchOutcome:
    """What a batch returns to its gate: each request's value and the child it ran."""

    values: tuple[Any, ...]
    """In request order; a failed child's entry is ``{"error": message}``."""
    children: tuple[str | None, ...]
    """The entity each request ran, in request order (``None``: none was spawned --
    its request could not be built, or the tree's budget refused it)."""
    failed: tuple[str, ...] = ()
    """The children that failed (their entries are errors), in request order."""

    @property
    def detail(self) -> dict[str, Any]:
        """The batch call's record detail: ``children`` (and ``failed`` if any), so
        a reader of the loom -- a replica telling the children as sub-agents, an
        export -- finds each child's own turns from the call, as ``child`` does for
        ``call_agent``."""
        detail: dict[str, Any] = {"children": list(self.children)}
        if self.failed:
            detail["failed"] = list(self.failed)
        return detail


async def delegate_batch_outcome(requests: Sequence[Mapping[str, Any]]) -> BatchOutcome:
    """Run children concurrently; results in request order (COMP-3), with the child
    each request ran (:class:`BatchOutcome`).

    Children start in request order and at most ``max_concurrency`` (default
    8) run at once; a batch holds at most ``max_batch_size`` (default 50). One
    child's failure is that child's entry (``{"error": ...}``), not the batch's.
    """
    parent = current_entity()
    wards = parent.circle.resolved
    limit = int(wards.get("max_batch_size") or MAX_BATCH)
    if len(requests) > min(limit, MAX_BATCH):
        raise GateError(
            f"a batch holds at most {min(limit, MAX_BATCH)} requests, got {len(requests)}"
        )
    if not requests:
        return BatchOutcome((), ())
    spawn_point = parent.checkpoint()
    limiter = trio.CapacityLimiter(int(wards.get("max_concurrency") or DEFAULT_CONCURRENCY))
    results: list[Any] = [None] * len(requests)
    children: list[str | None] = [None] * len(requests)
    failed: list[bool] = [False] * len(requests)

    async def one(index: int, request: dict[str, Any], task_status: Any) -> None:
        task_status.started()
        async with limiter:
            try:
                outcome = await _run_child(parent, request, spawn_point)
            except GateError as failure:
                results[index] = {"error": str(failure)}
                child = failure.detail.get("child")
                if isinstance(child, str):
                    children[index], failed[index] = child, True
                return
            results[index], children[index] = outcome.value, outcome.entity_id

    async with trio.open_nursery() as nursery:
        for index, request in enumerate(requests):
            await nursery.start(one, index, dict(request))
    return BatchOutcome(
        tuple(results),
        tuple(children),
        tuple(c for c, bad in zip(children, failed, strict=True) if bad and c is not None),
    )


async def _run_child(parent: Entity, request: dict[str, Any], spawn_point: str) -> ChildOutcome:
    from cantrip._core import Entity

    try:
        spell, llm = _child_cantrip(parent, request)
    except ConstructionError as exc:
        raise GateError(f"cannot spawn child: {exc}") from None
    refused = _child_refused(parent)
    if refused is not None:
        raise GateError(f"cannot spawn child: {refused}")
    intent = request.get("intent")
    context = request.get("context")
    if context is not None and isinstance(intent, str):
        shown = context if isinstance(context, str) else _json(context)
        intent = f"{intent}\n\nContext from the parent entity:\n{shown}"
    child = Entity.fresh(
        spell,
        llm=llm,
        parent_entity_id=parent.id,
        spawned_from=spawn_point,
        depth=parent.depth + 1,
        on_event=spell.event_sink(parent.on_event),
    )
    try:
        async with child:
            outcome: CastResult = await child.send(intent)
    except CantripError as exc:  # the child boundary (COMP-8, D-011): its LLM gave up, ...
        _log.warning("child entity %s failed", child.id, exc_info=exc)
        raise GateError(
            f"child entity {child.id} failed: {type(exc).__name__}: {exc}",
            detail={"child": child.id},  # its turns, for a reader of the loom
        ) from exc
    except ChildCrashedError:
        raise  # a grandchild's crash, already described
    except Exception as exc:
        # Not a gate's fault (the child's own gate boundary took those) nor its
        # LLM's: a runtime bug. It crashes the parent to its supervisor.
        _log.error("child entity %s crashed", child.id, exc_info=exc)
        raise ChildCrashedError(
            f"child entity {child.id} crashed: {type(exc).__name__}: {exc}"
        ) from exc
    if outcome.truncated:
        return ChildOutcome(
            outcome.summary, truncated=True, entity_id=child.id, reason=outcome.reason
        )
    return ChildOutcome(outcome.result, entity_id=child.id)


def _child_refused(parent: Entity) -> str | None:
    """Why the parent's tree may not start another child (``None``: it may): it
    takes one ``max_children`` unit (cantrip._core._budget), and a tree whose
    tokens or dollars are spent starts none -- the child could not make a call."""
    cast = parent._cast
    if cast is None:
        return None
    budget = cast.budget
    if budget.bounded:
        spent = budget.refusal("max_tokens_total")
        if spent is not None:
            return spent
    if cast.meter.bounded:
        spent_usd = cast.meter.refusal()
        if spent_usd is not None:
            return spent_usd
    return budget.take("max_children") if budget.bounded else None


def _child_cantrip(parent: Entity, request: Mapping[str, Any]) -> tuple[Any, LLM]:
    from cantrip._cantrip import Cantrip
    from cantrip._circle import Circle

    known = {"intent", "context", "gates", "wards", "llm", "identity", "medium"}
    unknown = sorted(set(request) - known)
    if unknown:
        raise ConstructionError(f"unknown fields in the child request: {unknown}")
    if not isinstance(request.get("intent"), str) or not str(request.get("intent")).strip():
        raise ConstructionError("the child request needs an intent (a non-empty string)")
    spell = parent.cantrip
    wards = _child_wards(parent.circle.resolved, request.get("wards"))
    llm = _child_llm(parent, request.get("llm"))
    medium = _child_medium(parent, request.get("medium"), llm)
    gates = _child_gates(parent, request.get("gates"))
    providers = spell.circle.providers if request.get("gates") is None else ()
    if providers:
        # A child that inherits the circle inherits its gate providers, not the
        # parent's open sessions: it opens its own (and closes them when it ends).
        gates = list(spell.circle.gates)
    circle = Circle(
        gates,
        wards.as_wards(),
        medium,
        approval=parent.circle.approval,
        providers=providers,
        guardrails=parent.circle.guardrails,  # a child cannot escape its parent's checks
    )
    identity = _child_identity(request.get("identity"))
    child = Cantrip(
        llm=llm,
        identity=identity,
        circle=circle,
        loom=spell.loom,
        retry=spell.retry,
        llms=spell.llms,
        folding=spell.folding,
    )
    return child, llm


def _child_wards(parent: WardSet, proposed: Any) -> WardSet:
    wards: list[Ward] = []
    for raw in proposed or ():
        wards.extend(Ward.parse(raw))
    composed = parent.compose(WardSet.resolve(wards))
    depth = parent.max_depth if parent.max_depth is not None else DEFAULT_DEPTH
    values = dict(composed.values)
    values["max_depth"] = min(int(values.get("max_depth", depth)), depth - 1)
    return WardSet(values)


def _child_llm(parent: Entity, name: Any) -> LLM:
    spell = parent.cantrip
    if name is not None:
        if not isinstance(name, str):
            raise ConstructionError(f"llm must be a name, not {name!r}")
        return spell.resolve_llm(name)
    level = parent.depth + 1
    for candidate in (f"child_llm_l{level}", "child_llm"):
        if candidate in spell.llms:
            return spell.llms[candidate]
    return parent.llm


def _child_medium(parent: Entity, name: Any, llm: LLM) -> Any:
    from cantrip._medium_names import resolve_medium_name

    declared = name if name is not None else getattr(llm, "speaks", None)
    if declared is None:
        return parent.circle.medium
    if not isinstance(declared, str):
        raise ConstructionError(f"medium must be a name, not {declared!r}")
    if declared == parent.circle.medium.name:
        return parent.circle.medium
    medium = resolve_medium_name(declared)
    if medium.name in UNSANDBOXED_MEDIUMS and parent.circle.medium.name not in UNSANDBOXED_MEDIUMS:
        # Delegation must not be a way out of a sandbox (SPEC.md "Code mediums").
        raise ConstructionError(
            f"medium {declared!r} is not a sandbox; a child may use it only when its "
            "parent already works in it"
        )
    return medium


def _child_gates(parent: Entity, names: Any) -> list[Gate]:
    if names is None:
        return list(parent.circle.gates)
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConstructionError(f"gates must be a list of gate names, not {names!r}")
    chosen: list[Gate] = []
    for name in ["done", *names]:
        g = parent.circle.gate(name) or named_gate(name)
        if g is None:
            known = sorted({*gate_names(), *parent.circle.gate_names})
            raise ConstructionError(f"unknown gate {name!r} for the child (known: {known})")
        if g.missing_dependencies:
            raise ConstructionError(
                f"gate {name!r} needs dependencies the parent's circle does not provide: "
                f"{', '.join(g.missing_dependencies)}"
            )
        if all(existing.name != g.name for existing in chosen):
            chosen.append(g)
    return chosen


def _child_identity(proposed: Any) -> Identity:
    if proposed is None:
        return Identity(system_prompt=CHILD_IDENTITY)
    if isinstance(proposed, str):
        return Identity(system_prompt=proposed)
    if isinstance(proposed, Mapping):
        try:
            return Identity.from_dict(proposed)
        except TypeError as exc:
            raise ConstructionError(f"invalid child identity: {exc}") from None
    raise ConstructionError(f"identity must be a string or an object, not {proposed!r}")


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, default=str)
