"""Gates: host functions with metadata, the crossing points of a circle (4.3).

A gate is an ordinary Python function, sync or async, wrapped by :func:`gate`.
The wrapper derives the JSON Schema the LLM sees from the type hints, and
validates every call's arguments with pydantic before the function runs.
Dependencies (a filesystem root, a timeout, an HTTP client) are parameters
named in ``dependencies``: they are left out of the schema and supplied once,
with :meth:`Gate.bind`, when the circle is constructed (CIRCLE-10).

Built-in gates (``gates/``) are written exactly this way, and so are users'.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar, get_type_hints, overload

import attrs
import pydantic
import trio

from cantrip._errors import ConstructionError
from cantrip.llm._contract import ToolDefinition, plain_json


class GateArgumentError(ValueError):
    """The arguments of a gate call failed validation; the entity sees the message."""


class GateError(Exception):
    """Raise from a gate to report a failure in plain words (no traceback noise).

    ``detail``: facts for the failed call's record (``GateCallRecord.detail``), as a
    :class:`GateResult` gives them for one that answered -- e.g. the id of a
    delegation's child that failed, so a reader of the loom finds the child's own
    turns from its parent's call. The entity sees only the message."""

    def __init__(self, *args: object, detail: Mapping[str, Any] | None = None) -> None:
        super().__init__(*args)
        self.detail: Mapping[str, Any] = dict(detail or {})


@attrs.frozen
class GateResult:
    """A gate's return value plus facts for its record (``GateCallRecord.detail``),
    e.g. ``GateResult(summary, {"truncated": True})`` from a delegation whose child
    was cut off by a ward. The entity sees only ``value``."""

    value: Any
    detail: Mapping[str, Any] = attrs.field(factory=dict)
    is_error: bool = False
    """Record the call as failed (``is_error``) while keeping ``detail``: a gate
    provider's tool that reported an error, e.g. an MCP result with ``isError``."""


def _frozen(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Gate:
    """A host function plus everything the circle needs to present and call it."""

    name: str
    fn: Callable[..., Any] = attrs.field(eq=False, repr=False)
    description: str = ""
    args_model: type[pydantic.BaseModel] = attrs.field(default=None, eq=False, repr=False)
    parameters: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen, repr=False)
    dependencies: tuple[str, ...] = ()
    bound: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    terminates: bool = False
    """The ``done`` gate: a successful call ends the loop with its result."""
    ephemeral: bool = False
    """Full result kept in the loom, a placeholder in the working context (PROD-5)."""
    blocking: bool = False
    """A sync function that blocks (disk, subprocess): run it in a worker thread."""
    delegates: bool = False
    """A delegation gate (call_agent*): removed structurally at depth 0 (COMP-6)."""
    aliases: tuple[str, ...] = ()
    """Other names the gate answers to at parsing boundaries (D-002)."""
    idempotent: bool = False
    """Safe to run twice with the same arguments. A call that was started but whose
    result was never recorded (its worker crashed) is re-run on resume only if the
    gate is idempotent; otherwise the entity is told the outcome is unknown
    (cantrip._journal)."""
    requires_approval: bool = False
    """Every call waits for a human's yes first (a pause, see cantrip._approval)."""
    asks_user: bool = False
    """The gate is a question to a human: the answer is its result (``ask_user``)."""
    _is_async: bool = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(self.fn))

    def bind(self, **dependencies: Any) -> Gate:
        """A copy with dependencies supplied (CIRCLE-10). Unknown names are refused."""
        unknown = sorted(set(dependencies) - set(self.dependencies))
        if unknown:
            raise ConstructionError(
                f"gate {self.name!r} has no dependency {', '.join(map(repr, unknown))}"
                f" (it takes: {', '.join(self.dependencies) or 'none'})"
            )
        return attrs.evolve(self, bound={**self.bound, **dependencies})

    def renamed(self, name: str) -> Gate:
        return attrs.evolve(self, name=name)

    def with_options(self, **options: Any) -> Gate:
        """A copy with metadata changed, e.g. ``ephemeral=True``."""
        return attrs.evolve(self, **options)

    @property
    def missing_dependencies(self) -> list[str]:
        return [d for d in self.dependencies if d not in self.bound]

    def definition(self) -> ToolDefinition:
        """How the LLM sees this gate (IDENTITY-3)."""
        return ToolDefinition(self.name, self.description, plain_json(self.parameters))

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments, or :class:`GateArgumentError` in plain words."""
        try:
            model = self.args_model.__pydantic_validator__.validate_python(dict(args))
        except pydantic.ValidationError as exc:
            raise GateArgumentError(_describe_validation(self.name, exc)) from None
        values = dict(model.__dict__)
        if model.model_extra:
            values.update(model.model_extra)
        return values

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Validate and run. Exceptions of the gate's own code propagate to the caller,
        which is the gate-call boundary that turns them into observations."""
        kwargs = self.validate(args)
        if self.bound:
            kwargs.update(self.bound)
        if self._is_async:
            return await self.fn(**kwargs)
        if self.blocking:
            # A thread cannot be stopped: on cancellation (timeout_s, a parent's cancel)
            # the call is abandoned at once and recorded cancelled; the function runs on
            # to its end in its thread and its result is dropped (issue 13, item 4).
            return await trio.to_thread.run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
        result = self.fn(**kwargs)
        if type(result) not in _PLAIN and inspect.isawaitable(result):
            return await result
        return result


_PLAIN = frozenset({str, int, float, bool, type(None), dict, list, tuple})
"""Result types that are never awaitable: no need to ask ``inspect`` (every call)."""

F = TypeVar("F", bound=Callable[..., Any])


@overload
def gate(fn: Callable[..., Any], /) -> Gate: ...


@overload
def gate(
    *,
    name: str | None = ...,
    description: str | None = ...,
    dependencies: tuple[str, ...] = ...,
    terminates: bool = ...,
    ephemeral: bool = ...,
    blocking: bool = ...,
    delegates: bool = ...,
    aliases: tuple[str, ...] = ...,
    parameters: Mapping[str, Any] | None = ...,
    idempotent: bool = ...,
    requires_approval: bool = ...,
    asks_user: bool = ...,
) -> Callable[[Callable[..., Any]], Gate]: ...


def gate(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    dependencies: tuple[str, ...] = (),
    terminates: bool = False,
    ephemeral: bool = False,
    blocking: bool = False,
    delegates: bool = False,
    aliases: tuple[str, ...] = (),
    parameters: Mapping[str, Any] | None = None,
    idempotent: bool = False,
    requires_approval: bool = False,
    asks_user: bool = False,
) -> Gate | Callable[[Callable[..., Any]], Gate]:
    """Make a gate of a function. Usable bare (``@gate``) or with options.

    The description defaults to the docstring; the schema comes from the type
    hints (``parameters`` overrides the presented schema but never validation).
    """

    def build(func: Callable[..., Any]) -> Gate:
        gate_name = name or func.__name__
        model = _args_model(gate_name, func, set(dependencies))
        schema = dict(parameters) if parameters is not None else _schema_of(model)
        signature = inspect.signature(func)
        defaults = {
            dep: signature.parameters[dep].default
            for dep in dependencies
            if dep in signature.parameters
            and signature.parameters[dep].default is not inspect.Parameter.empty
        }
        return Gate(
            name=gate_name,
            fn=func,
            description=(description or inspect.getdoc(func) or "").strip(),
            args_model=model,
            parameters=schema,
            dependencies=tuple(dependencies),
            bound=defaults,
            terminates=terminates,
            ephemeral=ephemeral,
            blocking=blocking,
            delegates=delegates,
            aliases=aliases,
            idempotent=idempotent,
            requires_approval=requires_approval,
            asks_user=asks_user,
        )

    if fn is not None:
        return build(fn)
    return build


def _args_model(
    gate_name: str, func: Callable[..., Any], dependencies: set[str]
) -> type[pydantic.BaseModel]:
    signature = inspect.signature(func)
    try:
        hints = get_type_hints(func)
    except (NameError, TypeError) as exc:
        raise ConstructionError(f"gate {gate_name!r}: cannot read its type hints ({exc})") from exc
    missing = dependencies - set(signature.parameters)
    if missing:
        raise ConstructionError(
            f"gate {gate_name!r} declares dependencies it does not take: {sorted(missing)}"
        )
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name in dependencies:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConstructionError(f"gate {gate_name!r}: *args/**kwargs cannot be presented")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{gate_name}_arguments", __config__=config, **fields
    )
    return model


def _schema_of(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.pop("additionalProperties", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return schema


def _describe_validation(gate_name: str, exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "missing":
            problems.append(f"missing required argument {where!r}")
        elif error["type"] == "extra_forbidden":
            problems.append(f"unexpected argument {where!r}")
        else:
            problems.append(f"argument {where!r}: {error['msg']}")
    return f"invalid arguments for gate {gate_name!r}: " + "; ".join(problems)


AnyCallable = Callable[..., Any] | Callable[..., Awaitable[Any]]
