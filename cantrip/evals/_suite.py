"""Suites: the cases an eval runs, and what each case expects.

A suite is a YAML (or TOML) file or a :class:`Suite` built in code::

    spec: ../hello.toml            # relative to the suite file
    cases:
      - name: greets
        intent: Greet the world, then finish.
        expect:
          result_contains: greeted
          gates: [echo, done]
          max_turns: 3

Every mistake in a suite file is reported at once, each naming the case and the
field (``case 'greets': expect.max_turns: must be a whole number``); an unknown
expectation lists the known ones.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cantrip._errors import ConstructionError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GateExpectation(_Strict):
    """A gate the agent must call, optionally with a subset of its arguments."""

    gate: str
    args: dict[str, Any] = Field(default_factory=dict)


class JudgeSpec(_Strict):
    """An LLM judge: a rubric the result is graded against."""

    rubric: str = Field(min_length=1)
    llm: str | None = None
    """A named LLM of the spec (``[llms.NAME]``) or of the suite (``llms``); the
    spec's own LLM when unset."""


class Expect(_Strict):
    """What a case expects. Every field is optional; all given must hold."""

    result_equals: Any = None
    result_contains: str | list[str] | None = None
    result_matches: str | None = None
    """A regular expression searched in the result's text."""
    result_schema: dict[str, Any] | None = None
    """A JSON Schema the result must validate against."""
    gates: list[str | GateExpectation] | None = None
    """Called in this order; other calls may come between."""
    gates_never: list[str] | None = None
    max_turns: int | None = Field(default=None, ge=0)
    min_turns: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_latency_s: float | None = Field(default=None, gt=0)
    ended: Literal["terminated", "truncated"] | None = None
    reason: str | None = None
    """How the cast ended: ``done``, ``text``, ``max_turns``, ``llm_error``, ..."""
    function: str | list[str] | None = None
    """``module:function`` called with the case's outcome; returns a bool, or a
    ``(bool, message)`` pair."""
    judge: JudgeSpec | None = None

    @field_validator("result_schema")
    @classmethod
    def _usable(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            from cantrip._json_schema import compile_schema

            try:
                compile_schema(schema)
            except ConstructionError as exc:
                raise ValueError(str(exc).replace("output schema", "the schema")) from None
        return schema

    @field_validator("result_matches")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            import re

            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc})") from None
        return pattern


EXPECTATIONS: tuple[str, ...] = tuple(Expect.model_fields)
"""The names an ``expect`` table may use."""


MAX_BEFORE = 50
"""Earlier sessions one case may play before its intent."""


class Case(_Strict):
    """One task for the agent and what must hold when it ends."""

    name: str = Field(min_length=1)
    intent: str = Field(min_length=1)
    expect: Expect = Field(default_factory=Expect)
    before: list[str] = Field(default_factory=list, max_length=MAX_BEFORE)
    """Intents sent first, in order, each in a session of its own (a new entity): what
    the agent was told earlier. Only memory carries anything from them to the case's
    own cast, which the checks judge (a cross-session case)."""
    user: str | None = Field(default=None, min_length=1, max_length=128)
    """The ``user`` tag of every session of the case (a ``[memory]`` namespace naming
    ``{user}`` needs one)."""

    @field_validator("before")
    @classmethod
    def _no_empty_intent(cls, before: list[str]) -> list[str]:
        if any(not text.strip() for text in before):
            raise ValueError("an earlier session's intent may not be empty")
        return before


class _SuiteDocument(_Strict):
    spec: str | None = None
    recording: str | None = None
    """The loom ``--replay`` reads when given no file (``cantrip eval add`` keeps it)."""
    llms: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """LLMs the suite's judges may name, in the spec's ``[llm]`` form."""
    cases: list[Case] = Field(min_length=1)


def _cases(value: Iterable[Case]) -> tuple[Case, ...]:
    return tuple(value)


@attrs.frozen
class Suite:
    """Cases to run against one spec.

    ``spec`` is a path (relative paths were resolved against the suite file) or
    ``None`` when the caller supplies the cantrip (the Python API, ``--spec``).
    """

    cases: tuple[Case, ...] = attrs.field(converter=_cases)
    spec: Path | None = None
    llms: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    source: str = "suite"
    recording: Path | None = None

    def __attrs_post_init__(self) -> None:
        names = [case.name for case in self.cases]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConstructionError(
                [f"{self.source}: case name {name!r} is used twice" for name in repeated]
            )


def load_suite(path: str | Path) -> Suite:
    """Read a suite file (``.yaml``/``.yml`` or ``.toml``), reporting every problem at once."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConstructionError(f"{path}: no such suite file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConstructionError(f"{path}: cannot read the suite ({exc})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConstructionError(f"{path}: not valid {_format(path)} ({_first_line(exc)})") from None
    return parse_suite(data, source=str(path), base_dir=path.parent)


def parse_suite(data: Any, *, source: str = "suite", base_dir: Path | None = None) -> Suite:
    """A suite from plain data (a parsed file); relative ``spec`` paths anchor at ``base_dir``."""
    if not isinstance(data, Mapping):
        raise ConstructionError(f"{source}: a suite is a table with 'cases' (and 'spec')")
    problems = _unknown_expectations(data, source)
    if problems:
        raise ConstructionError(problems)
    try:
        doc = _SuiteDocument.model_validate(data)
    except ValidationError as exc:
        raise ConstructionError(_problems(exc, data, source)) from None
    return Suite(
        cases=doc.cases,
        spec=_anchored(doc.spec, base_dir),
        llms=doc.llms,
        source=source,
        recording=_anchored(doc.recording, base_dir),
    )


def _anchored(value: str | None, base_dir: Path | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    return base_dir / path if not path.is_absolute() and base_dir is not None else path


def _unknown_expectations(data: Mapping[str, Any], source: str) -> list[str]:
    """Unknown ``expect`` keys, each with the known ones (pydantic would only say
    'extra inputs are not permitted')."""
    problems: list[str] = []
    cases = data.get("cases")
    if not isinstance(cases, Sequence) or isinstance(cases, str):
        return problems
    for position, case in enumerate(cases, 1):
        if not isinstance(case, Mapping) or not isinstance(case.get("expect"), Mapping):
            continue
        for key in case["expect"]:
            if key in EXPECTATIONS:
                continue
            close = difflib.get_close_matches(str(key), EXPECTATIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{source}: {_case_name(case, position)}: unknown expectation {key!r}{hint}; "
                f"known: {', '.join(EXPECTATIONS)}"
            )
    return problems


def _problems(exc: ValidationError, data: Mapping[str, Any], source: str) -> list[str]:
    out: list[str] = []
    cases = data.get("cases")
    for error in exc.errors():
        loc = list(error["loc"])
        where = source
        if len(loc) >= 2 and loc[0] == "cases" and isinstance(loc[1], int):
            case = cases[loc[1]] if isinstance(cases, Sequence) and loc[1] < len(cases) else {}
            where = f"{source}: {_case_name(case, loc[1] + 1)}"
            loc = loc[2:]
        field = ".".join(str(part) for part in loc if not _is_union_tag(part)) or "the case"
        out.append(f"{where}: {field}: {_message(error)}")
    return list(dict.fromkeys(out))


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in ("str", "GateExpectation"))


def _message(error: Any) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number"
    return str(error.get("msg", "is invalid")).removeprefix("Value error, ")


def _case_name(case: Any, position: int) -> str:
    name = case.get("name") if isinstance(case, Mapping) else None
    return f"case {name!r}" if isinstance(name, str) and name else f"case #{position}"


def _format(path: Path) -> str:
    return "TOML" if path.suffix == ".toml" else "YAML"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
