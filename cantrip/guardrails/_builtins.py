"""The built-in checks: ``secrets``, ``regex``, ``json_schema``, ``length``, ``denylist``.

Each is bounded whatever the value holds (Wave 3: the event loop is never held by
untrusted input): patterns go to RE2 (``google-re2``), which matches in linear time
and has no backtracking; a JSON schema is compiled by the runtime's linear-time
validator (:mod:`cantrip._json_schema`); the credential shapes are the redaction
shapes every front end uses (:mod:`cantrip._redact`).

A value that is not text is looked at string by string (the arguments of a call,
a structured answer): a pattern or a secret is searched in every string inside it,
a rewrite rewrites each string in place.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import orjson

from cantrip._errors import ConstructionError
from cantrip._install import require_extra
from cantrip._json_schema import compile_schema
from cantrip._redact import REDACTED, redact
from cantrip.guardrails._model import (
    CheckContext,
    Guardrail,
    Rewrite,
    Trip,
    Where,
)

Action = Literal["trip", "redact"]
ALL: tuple[Where, ...] = ("input", "output", "call", "result")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {key: _map_strings(item, fn) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(item, fn) for item in value]
    return value


def _action(name: str, action: str) -> Action:
    if action not in ("trip", "redact"):
        raise ConstructionError(f"guardrail {name!r}: action is trip or redact, not {action!r}")
    return action  # type: ignore[return-value]


def _blocking(action: Action, on: Iterable[Where], blocking: bool | None) -> bool:
    """A redacting check on input rewrites, so it runs before the model call."""
    if blocking is not None:
        return blocking
    return action == "redact" and "input" in tuple(on)


def _on(on: Where | Iterable[Where] | None, default: Iterable[Where]) -> tuple[Where, ...]:
    if on is None:
        return tuple(default)
    return (on,) if isinstance(on, str) else tuple(on)


def secrets(
    *,
    on: Where | Iterable[Where] | None = None,
    action: Action = "redact",
    name: str = "secrets",
    blocking: bool | None = None,
) -> Guardrail:
    """Credentials (the redaction shapes: API keys, tokens, ``password=...``, and the
    values of the environment's secret variables): redacted to ``[REDACTED]``
    (``action="redact"``, the default) or a trip (``action="trip"``). Everywhere
    by default."""
    act = _action(name, action)
    places = _on(on, ALL)

    def check(value: Any, context: CheckContext) -> Trip | Rewrite | None:
        changed = _map_strings(value, redact)
        if changed == value:
            return None
        if act == "trip":
            return Trip(f"a credential in the {context.where}")
        return Rewrite(changed, "credentials redacted")

    return Guardrail(name, check, places, _blocking(act, places, blocking))


def _compile(name: str, pattern: str) -> Any:
    """``pattern`` compiled by RE2 (the ``guardrails`` extra, imported here only)."""
    require_extra("guardrails", f"guardrail {name!r} (an RE2 pattern)")
    import re2

    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise ConstructionError(
            f"guardrail {name!r}: pattern {pattern!r} is not one RE2 takes "
            f"(no look-around or back-references): {exc}"
        ) from exc


def regex(
    pattern: str,
    *,
    on: Where | Iterable[Where] | None = None,
    action: Action = "trip",
    replacement: str = REDACTED,
    name: str = "regex",
    blocking: bool | None = None,
) -> Guardrail:
    """A regular expression (RE2 syntax, linear time): a match trips the cast, or
    with ``action="redact"`` is replaced by ``replacement``. Input and output by
    default."""
    act = _action(name, action)
    compiled = _compile(name, pattern)
    places = _on(on, ("input", "output"))

    def check(value: Any, context: CheckContext) -> Trip | Rewrite | None:
        if not any(compiled.search(text) for text in _strings(value)):
            return None
        if act == "trip":
            return Trip(f"the {context.where} matches {pattern!r}")
        return Rewrite(
            _map_strings(value, lambda text: compiled.sub(replacement, text)),
            f"matches of {pattern!r} replaced",
        )

    return Guardrail(name, check, places, _blocking(act, places, blocking))


def json_schema(
    schema: Mapping[str, Any],
    *,
    on: Where | Iterable[Where] | None = None,
    name: str = "json_schema",
    blocking: bool = False,
) -> Guardrail:
    """The value must satisfy a JSON Schema (checked by the runtime's linear-time
    validator, the one ``[output] schema`` uses): a call's arguments, an answer, a
    result, or an input text (a JSON string value). Output by default."""
    validator = compile_schema(schema)

    def check(value: Any, context: CheckContext) -> Trip | None:
        for error in validator.iter_errors(value):
            where = "/".join(str(part) for part in error.instance_path) or "the value"
            return Trip(f"the {context.where} does not fit the schema at {where}: {error.message}")
        return None

    return Guardrail(name, check, _on(on, ("output",)), blocking)


def length(
    max_chars: int,
    *,
    on: Where | Iterable[Where] | None = None,
    name: str = "length",
    blocking: bool = False,
) -> Guardrail:
    """At most ``max_chars`` characters (text as it is; anything else as its JSON).
    Input and output by default."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0:
        raise ConstructionError(
            f"guardrail {name!r}: max_chars is a whole number, not {max_chars!r}"
        )

    def check(value: Any, context: CheckContext) -> Trip | None:
        size = len(value) if isinstance(value, str) else len(orjson.dumps(value, default=str))
        if size > max_chars:
            return Trip(f"the {context.where} has {size} characters, more than {max_chars}")
        return None

    return Guardrail(name, check, _on(on, ("input", "output")), blocking)


def denylist(
    *,
    gates: Iterable[str] = (),
    patterns: Iterable[str] = (),
    name: str = "denylist",
) -> Guardrail:
    """Calls that may not run: to a gate matching one of ``gates`` (globs:
    ``"bash"``, ``"mcp_*"``), or with an argument string matching one of
    ``patterns`` (RE2). Checked on ``call``: before the gate runs, and before a
    human is asked to approve it."""
    globs = tuple(gates)
    compiled = [(p, _compile(name, p)) for p in patterns]
    if not globs and not compiled:
        raise ConstructionError(f"guardrail {name!r}: a denylist names gates or patterns")

    def check(value: Any, context: CheckContext) -> Trip | None:
        gate = context.gate or ""
        for glob in globs:
            if fnmatch.fnmatchcase(gate, glob):
                return Trip(f"gate {gate!r} is on the denylist ({glob!r})")
        for pattern, engine in compiled:
            if any(engine.search(text) for text in _strings(value)):
                return Trip(f"an argument of {gate!r} matches the denylisted {pattern!r}")
        return None

    return Guardrail(name, check, ("call",), True)


def canonical(value: Any) -> str:
    """A value as text for a check that reads text (the classifier): itself if text,
    else its JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS).decode()
