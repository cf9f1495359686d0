"""The ``[[circle.guardrails]]`` tables: each names a check and where it applies.

.. code-block:: toml

    [[circle.guardrails]]
    check = "secrets"                # a built-in, or "package.module:function"
    on = ["input", "output"]         # input | output | call | result
    blocking = true                  # input: before the model call (default: beside it)

A built-in takes its own keys (``action``, ``pattern``, ``replacement``, ``schema``,
``max_chars``, ``gates``, ``patterns``); ``check = "classifier"`` casts a cantrip of
its own: ``llm`` (a name from ``[llms]``; default the spec's own) told ``prompt`` as
its system prompt, whose answer (``pass`` or ``trip: why``) decides. Every table is
read by :class:`GuardrailTable` and every problem reported with the table's index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from cantrip._cantrip import Cantrip
from cantrip._circle import Circle
from cantrip._errors import ConstructionError
from cantrip._identity import Identity
from cantrip._reference import import_reference
from cantrip._wards import max_turns
from cantrip.guardrails import (
    Guardrail,
    classifier,
    denylist,
    guardrail,
    json_schema,
    length,
    regex,
    secrets,
)
from cantrip.llm._contract import LLM
from gates import done

BUILTINS = ("secrets", "regex", "json_schema", "length", "denylist", "classifier")
Place = Literal["input", "output", "call", "result"]


class GuardrailTable(pydantic.BaseModel):
    """One ``[[circle.guardrails]]`` table (pydantic at the edge)."""

    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True)

    check: str
    """A built-in (secrets, regex, json_schema, length, denylist, classifier) or
    ``"package.module:function"``."""
    name: str | None = None
    on: Place | list[Place] | None = None
    blocking: bool | None = None
    action: Literal["trip", "redact"] | None = None
    pattern: str | None = None
    replacement: str | None = None
    json_schema: dict[str, Any] | None = pydantic.Field(default=None, alias="schema")
    max_chars: int | None = pydantic.Field(default=None, ge=0)
    gates: list[str] = pydantic.Field(default_factory=list)
    patterns: list[str] = pydantic.Field(default_factory=list)
    llm: str | None = None
    prompt: str | None = None
    max_turns: int = pydantic.Field(default=3, ge=1)
    """The classifier's casts: at most this many turns."""


_KEYS = {
    "secrets": {"action"},
    "regex": {"pattern", "action", "replacement"},
    "json_schema": {"json_schema"},
    "length": {"max_chars"},
    "denylist": {"gates", "patterns"},
    "classifier": {"llm", "prompt", "max_turns"},
}
_OWN = {key for keys in _KEYS.values() for key in keys}


def guardrails_from_tables(
    tables: list[dict[str, Any]],
    problems: list[str],
    *,
    llm: LLM | None,
    named: Mapping[str, LLM],
) -> list[Guardrail]:
    """Each table built; problems appended with the table's index."""
    built: list[Guardrail] = []
    for index, raw in enumerate(tables):
        where = f"circle.guardrails[{index}]"
        try:
            table = GuardrailTable.model_validate(raw)
        except pydantic.ValidationError as exc:
            for error in exc.errors():
                field = ".".join(str(part) for part in error["loc"])
                problems.append(f"{where}.{field}: {error['msg']}")
            continue
        try:
            built.append(_build(table, llm, named))
        except ConstructionError as exc:
            problems.extend(f"{where}: {problem}" for problem in exc.problems)
    return built


def _build(table: GuardrailTable, llm: LLM | None, named: Mapping[str, LLM]) -> Guardrail:
    kind = table.check
    given = {key for key in _OWN if key in table.model_fields_set}
    allowed = _KEYS.get(kind, set())
    stray = sorted(given - allowed)
    if stray:
        shown = ["schema" if key == "json_schema" else key for key in stray]
        raise ConstructionError(f"check {kind!r} takes no {', '.join(shown)}")
    common: dict[str, Any] = {}
    if table.on is not None:
        common["on"] = table.on
    if table.name is not None:
        common["name"] = table.name
    blocking = table.blocking
    if kind == "secrets":
        return secrets(action=table.action or "redact", blocking=blocking, **common)
    if kind == "regex":
        if table.pattern is None:
            raise ConstructionError("check 'regex' needs a pattern")
        extra: dict[str, Any] = (
            {"replacement": table.replacement} if table.replacement is not None else {}
        )
        return regex(
            table.pattern, action=table.action or "trip", blocking=blocking, **extra, **common
        )
    if kind == "json_schema":
        if table.json_schema is None:
            raise ConstructionError("check 'json_schema' needs a schema")
        return json_schema(table.json_schema, blocking=bool(blocking), **common)
    if kind == "length":
        if table.max_chars is None:
            raise ConstructionError("check 'length' needs max_chars")
        return length(table.max_chars, blocking=bool(blocking), **common)
    if kind == "denylist":
        if table.on is not None and table.on not in ("call", ["call"]):
            raise ConstructionError("check 'denylist' applies on call only")
        common.pop("on", None)
        return denylist(gates=table.gates, patterns=table.patterns, **common)
    if kind == "classifier":
        return classifier(_classifier_cantrip(table, llm, named), blocking=bool(blocking), **common)
    if ":" not in kind:
        raise ConstructionError(
            f"unknown check {kind!r} (built-ins: {', '.join(BUILTINS)}; "
            "or 'package.module:function')"
        )
    function = import_reference(kind, "guardrail check", "package.module:function")
    if not callable(function):
        raise ConstructionError(f"guardrail check {kind!r} is not callable")
    return guardrail(function, blocking=bool(blocking), **common)


def _classifier_cantrip(
    table: GuardrailTable, llm: LLM | None, named: Mapping[str, LLM]
) -> Cantrip:
    if table.llm is not None:
        if table.llm not in named:
            known = ", ".join(sorted(named)) or "none"
            raise ConstructionError(
                f"classifier llm {table.llm!r} is not a named llm (known: {known})"
            )
        chosen: LLM | None = named[table.llm]
    else:
        chosen = llm
    if chosen is None:
        raise ConstructionError("a classifier needs an llm")
    prompt = table.prompt or (
        "You check text for a guardrail. Answer with one line: 'pass' if it is "
        "acceptable, or 'trip: <why>' if it is not."
    )
    return Cantrip(
        llm=chosen,
        identity=Identity(system_prompt=prompt),
        circle=Circle([done], [max_turns(table.max_turns)]),
    )
