"""The identity: the immutable configuration that shapes the LLM (chapter 3)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs

from cantrip._errors import ConstructionError, ImmutableError

ToolChoice = Literal["auto", "required", "none"]

_HYPERPARAMETERS = ("temperature", "top_p", "max_tokens", "stop", "seed")


def _refuse_mutation(instance: object, attribute: attrs.Attribute[Any], value: object) -> Any:
    raise ImmutableError(
        f"identity is immutable: cannot set {attribute.name!r}; "
        "build a new cantrip with a new identity"
    )


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """Where in ``value`` a NaN or an infinity sits, and which, if anywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _non_finite(item, where)
        if found is not None:
            return found
    return None


def _finite(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    """JSON has no NaN or infinity: a request carrying one is either refused by the
    provider or, written by a lenient encoder, silently carries ``null`` instead --
    so the identity refuses it where it is written, with its place named."""
    found = _non_finite(value, attribute.name)
    if found is not None:
        where, number = found
        raise ConstructionError(f"identity: {where} must be a finite number, not {number!r}")


@attrs.define(kw_only=True, on_setattr=_refuse_mutation, unsafe_hash=True)
class Identity:
    """System prompt plus hyperparameters; fixed once constructed (IDENTITY-1).

    ``system_prompt`` may be ``None`` (a minimal cantrip sends no system
    message). ``tool_choice`` overrides the medium's default gate presentation
    (``auto`` for conversation, ``required`` for code mediums). ``extra`` is
    passed through to the provider untouched (spec 2.1).
    """

    system_prompt: str | None = None
    temperature: float | None = attrs.field(default=None, validator=_finite)
    top_p: float | None = attrs.field(default=None, validator=_finite)
    max_tokens: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    seed: int | None = None
    tool_choice: ToolChoice | None = None
    extra: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=_finite, hash=False
    )

    def __delattr__(self, name: str) -> None:
        raise ImmutableError(f"identity is immutable: cannot delete {name!r}")

    def hyperparameters(self) -> dict[str, Any]:
        """The sampling parameters that are set, as sent with every query."""
        params: dict[str, Any] = {}
        for name in _HYPERPARAMETERS:
            value = getattr(self, name)
            if value is not None and value != ():
                params[name] = list(value) if name == "stop" else value
        return params

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, as stored in the loom's root context (IDENTITY-4)."""
        data: dict[str, Any] = {"system_prompt": self.system_prompt}
        data.update(self.hyperparameters())
        if self.tool_choice is not None:
            data["tool_choice"] = self.tool_choice
        if self.extra:
            data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Identity:
        return cls(**dict(data))
