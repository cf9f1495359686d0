"""A person's answer to a form: what an MCP server's elicitation gets back.

An MCP server may ask the user for a few values while it works on a call
(``elicitation/create``, form mode): a message and a *requested schema*, a flat
object of strings, numbers, booleans and enums. Cantrip asks that question like
any other (a :class:`~cantrip.Pause` of kind ``question``), so the answer
arrives as text typed at a terminal, sent over HTTP or given through the API.
This module turns that text into the object the server asked for, and checks
it against the server's schema before anything is sent:

* a JSON object is taken as the whole answer;
* anything else is the value of the one field a one-field schema has (typed as
  the field says: ``"3"`` for an integer is ``3``, ``"yes"`` for a boolean is
  ``true``);
* the result must satisfy the requested schema, checked by the linear-time
  validator (:mod:`cantrip._json_schema`): the schema is the server's, so it
  is untrusted like an answer -- a backtracking ``pattern`` could otherwise
  hold the event loop.

A wrong answer is refused with a message saying what the form wants; the
pause stays open for a better one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cantrip._errors import ConstructionError
from cantrip._json_schema import compile_schema

_TRUE = ("true", "yes", "y", "1", "on")
_FALSE = ("false", "no", "n", "0", "off")
_MAX_ANSWER_CHARS = 64_000
"""An answer longer than this is refused unread (a form holds a few short values)."""


MAX_FORM_CHARS = 64_000
"""A requested schema larger than this (as JSON) is refused unasked: a form is a flat
object of a few primitive fields, and compiling and checking an untrusted schema runs on
the event loop, so its size must be bounded."""


class AnswerError(ValueError):
    """The answer does not fill the form; the message says what it wants."""


def check_form(schema: Mapping[str, Any]) -> None:
    """:class:`AnswerError` if ``schema`` cannot be asked: over :data:`MAX_FORM_CHARS`."""
    size = len(json.dumps(schema, default=str))
    if size > MAX_FORM_CHARS:
        raise AnswerError(f"the form's schema is {size} characters (at most {MAX_FORM_CHARS})")


def form_content(schema: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The object ``text`` answers ``schema`` with, or :class:`AnswerError`."""
    if len(text) > _MAX_ANSWER_CHARS:
        raise AnswerError(f"the answer is longer than {_MAX_ANSWER_CHARS} characters")
    properties = schema.get("properties")
    fields = dict(properties) if isinstance(properties, Mapping) else {}
    content: Any
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            content = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise AnswerError(f"the answer looks like JSON but is not: {exc}") from None
    elif len(fields) == 1:
        ((name, field),) = fields.items()
        content = {name: _typed(field, stripped)}
    else:
        raise AnswerError(
            f"answer with a JSON object with the fields {sorted(fields)} "
            f"(e.g. {json.dumps(_example(fields))})"
        )
    return checked_content(schema, content)


def checked_content(schema: Mapping[str, Any], content: Any) -> dict[str, Any]:
    """``content`` if it is an object that satisfies ``schema``, else :class:`AnswerError`."""
    check_form(schema)
    if not isinstance(content, dict):
        raise AnswerError("the answer must be a JSON object")
    try:
        validator = compile_schema(schema)
    except ConstructionError as exc:
        raise AnswerError(f"the form cannot be filled: {exc}") from None
    errors = sorted(validator.iter_errors(content), key=lambda e: list(map(str, e.instance_path)))
    if errors:
        first = errors[0]
        where = "/".join(map(str, first.instance_path)) or "the answer"
        raise AnswerError(f"{where}: {first.message}")
    return content


def yes_no_field(schema: Mapping[str, Any] | None) -> str | None:
    """The field of a form that is one boolean and nothing else (a yes/no question a
    client that can only allow or reject -- ACP -- can answer), else None."""
    properties = schema.get("properties") if schema is not None else None
    if not isinstance(properties, Mapping) or len(properties) != 1:
        return None
    ((name, field),) = properties.items()
    return str(name) if isinstance(field, Mapping) and field.get("type") == "boolean" else None


def _typed(field: Any, text: str) -> Any:
    """``text`` as the one field's type wants it (left as text when it does not fit:
    the schema check then says what is wrong)."""
    kind = field.get("type") if isinstance(field, Mapping) else None
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return text
    if kind == "number":
        try:
            return float(text)
        except ValueError:
            return text
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered in _TRUE else False if lowered in _FALSE else text
    if kind == "array":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _example(fields: Mapping[str, Any]) -> dict[str, Any]:
    samples: dict[Any, Any] = {"integer": 1, "number": 1.5, "boolean": True, "array": ["..."]}
    return {
        name: samples.get(field.get("type") if isinstance(field, Mapping) else None, "...")
        for name, field in fields.items()
    }
